//! Thin main: parse config, init logs, dispatch; errors print once and exit non-zero.
use std::{io::IsTerminal, process::ExitCode};

use retry_agent::{
    cmd::Command,
    settings::{InvalidConfig, legacy_env},
};

/// sysexits EX_USAGE: the command line or configuration is wrong; retrying cannot help.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let renamed = legacy_env(|k: &str| std::env::var_os(k));
    for (_, new, value) in &renamed {
        // SAFETY: no other thread exists yet (the runtime starts below), so nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var(new, value) };
    }
    let cli = match retry_agent::cmd::parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return if usage {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: container logs and files must not carry escape codes.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    for (old, new, _) in &renamed {
        tracing::warn!("{old} is deprecated: it is read as {new}, set that instead");
    }

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("retry-agent: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let command = cli.command.unwrap_or_else(|| Command::Run(Box::default()));
    let result = rt.block_on(command.run());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("retry-agent: {e:#}");
            let usage = e.chain().any(|c| c.is::<InvalidConfig>());
            if usage {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
