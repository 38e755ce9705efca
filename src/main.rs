//! The `zkgate` binary: the controller and the participant commands.

fn main() {
    eprintln!("zkgate: the participant commands and the controller are not built yet");
    std::process::exit(2);
}
