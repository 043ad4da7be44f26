use clap::Parser;
use vramlab::cli::{Cli, Command};
use vramlab::cmd;
use vramlab::error::{exit_code, one_line};

fn main() {
    // Die quietly on a closed pipe (`vramlab ... | head`) instead of panicking in println!.
    // SAFETY: resetting a signal disposition to its default at startup, before any threads.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Sweep(a) => cmd::sweep::run(a),
        Command::SynthWeights(a) => cmd::synth_weights::run(a),
        Command::Decode(a) => cmd::decode::run(a),
        Command::Fit(a) => cmd::fit::run(a),
        Command::Estimate(a) => cmd::estimate::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Merge(a) => cmd::merge::run(a),
        Command::Bundle(a) => cmd::bundle::run(a),
        Command::Plot(a) => cmd::plot::run(a),
        Command::Validate(a) => cmd::validate::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Emulate(a) => cmd::emulate::run(a),
        Command::Gpus(a) => cmd::gpus::run(a),
        Command::Env(a) => cmd::env::run(a),
        Command::Schema(a) => cmd::schema::run(a),
        Command::Features(a) => cmd::features::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(exit_code(&e));
    }
}
