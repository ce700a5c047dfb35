//! Every (state, event) pair of the stream lifecycle, against the committed table in
//! `tests/state_table.txt`. A change to the lifecycle must change that file too, on purpose:
//! run with `UPDATE_STATE_TABLE=1` to rewrite it, then review the diff.

use velo_mux::state::State;

fn render() -> String {
    let mut out = String::from("# state         event      -> next (or invalid)\n");
    for state in State::ALL {
        for event in State::EVENTS {
            let next = match state.on(event) {
                Ok(next) => next.to_string(),
                Err(_) => "invalid".to_owned(),
            };
            out.push_str(&format!(
                "{:<15} {:<10} -> {next}\n",
                state.to_string(),
                format!("{event:?}")
            ));
        }
    }
    out
}

#[test]
fn every_state_event_pair_matches_the_committed_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/state_table.txt");
    let got = render();
    if std::env::var_os("UPDATE_STATE_TABLE").is_some() {
        std::fs::write(path, &got).expect("write the table");
    }
    let want = std::fs::read_to_string(path)
        .expect("tests/state_table.txt exists (UPDATE_STATE_TABLE=1 creates it)");
    assert_eq!(
        got, want,
        "the lifecycle changed; review and rerun with UPDATE_STATE_TABLE=1"
    );
}

#[test]
fn ended_streams_take_no_further_events() {
    for state in State::ALL.into_iter().filter(|s| !s.is_live()) {
        for event in State::EVENTS {
            assert!(state.on(event).is_err(), "{state} took {event:?}");
        }
    }
}
