//! The velo-rs benchmark (filled in by the bench issue).

fn main() {
    println!("velo-bench: not yet implemented");
}
