//! `executor-client`: drive an executor agent from the command line (the
//! verbs are in [`cli`]).
#![forbid(unsafe_code)]

mod cli;

fn main() {
    std::process::exit(cli::main());
}
