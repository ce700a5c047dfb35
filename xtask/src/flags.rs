//! Command-line flags of the form `--name VALUE` or `--name=VALUE`.

use std::collections::BTreeMap;

use crate::Result;

/// Parses `args` as value flags, accepting only the names in `known` (without `--`).
///
/// A flag given twice keeps its last value.
pub(crate) fn parse<'a>(args: &'a [String], known: &[&str]) -> Result<BTreeMap<String, &'a str>> {
    let mut flags = BTreeMap::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument `{arg}`").into());
        };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name, value),
            None => {
                let Some(value) = rest.next() else {
                    return Err(format!("`--{flag}` needs a value").into());
                };
                (flag, value.as_str())
            }
        };
        if !known.contains(&name) {
            return Err(format!("unknown flag `--{name}`").into());
        }
        flags.insert(name.to_owned(), value);
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], known: &[&str], expect: std::result::Result<&[(&str, &str)], &str>) {
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        match (parse(&args, known), expect) {
            (Ok(got), Ok(want)) => {
                let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                assert_eq!(got, want);
            }
            (Err(got), Err(want)) => assert_eq!(got.to_string(), want),
            (got, want) => panic!("parse({args:?}) = {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn flags_take_a_separate_or_joined_value() {
        check(&["--secs", "5"], &["secs"], Ok(&[("secs", "5")]));
        check(&["--secs=7"], &["secs"], Ok(&[("secs", "7")]));
        check(&[], &["secs"], Ok(&[]));
    }

    #[test]
    fn unknown_missing_and_positional_arguments_are_errors() {
        check(&["--frobs", "1"], &["secs"], Err("unknown flag `--frobs`"));
        check(&["--secs"], &["secs"], Err("`--secs` needs a value"));
        check(&["five"], &["secs"], Err("unexpected argument `five`"));
    }
}
