use clap::Parser;
use vramlab::cli::{Cli, Command};
use vramlab::cmd;
use vramlab::error::{exit_code, one_line};

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Sweep(a) => cmd::sweep::run(a),
        Command::SynthWeights(a) => cmd::synth_weights::run(a),
        Command::Generate(a) => cmd::generate::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(exit_code(&e));
    }
}
