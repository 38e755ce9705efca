//! The `zkgate` binary: the participant commands and the controller.

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use tracing_subscriber::EnvFilter;
use zkgate::cli::{Cli, LogFormat};

fn main() -> ExitCode {
    zkgate::install_crypto_provider();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Usage errors exit 2 with the usage line of the command given.
            let rendered = e.render().to_string();
            eprint!("{rendered}");
            if !rendered.contains("Usage:") {
                eprintln!("\n{}", usage_for(std::env::args().skip(1)));
            }
            return ExitCode::from(2);
        }
    };
    // The guardian must never wait on its standard error (see guardian);
    // a participant never waits on it on its only thread.
    let how = match cli.command {
        zkgate::cli::Command::Guard { .. } => LogTo::NeverBlocking,
        zkgate::cli::Command::Controller(_) => LogTo::Stderr,
        _ => LogTo::Queued,
    };
    let (writer, queue) = init_logging(cli.log_format, how);
    // The participant commands do a handful of requests: one thread starts
    // fastest and stays smallest. The controller reconciles many resources
    // at once: a worker per core.
    let mut builder = if matches!(cli.command, zkgate::cli::Command::Controller(_)) {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("zkgate: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(zkgate::cli::run(cli)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            // Through the log's writer: after the log lines, and never
            // waiting on a standard error nobody reads.
            let _ = writeln!(writer.clone(), "zkgate: {e}");
            ExitCode::from(e.exit as u8)
        }
    };
    // What is queued is written, unless standard error stays blocked
    // (then the queue's worker gives up after a second).
    drop(queue);
    code
}

/// The usage line of the deepest subcommand named in `args`.
fn usage_for(args: impl Iterator<Item = String>) -> String {
    let mut command = Cli::command();
    command.build();
    let mut current = &command;
    for arg in args {
        match current.find_subcommand(&arg) {
            Some(sub) => current = sub,
            None if arg.starts_with('-') => continue,
            None => break,
        }
    }
    current.clone().render_usage().to_string()
}

/// Standard error for log lines, where a line that cannot be written (the
/// reader of a pipe gone, as when a pipeline is killed) is dropped: the
/// subscriber reports a failed write with `eprintln!`, which panics when
/// standard error is that broken pipe, and a panic must not stop a
/// participant from releasing, nor a guardian from killing its command.
#[derive(Clone)]
enum LogWriter {
    /// Standard error as it is.
    Stderr,
    /// A queue that a thread of its own writes to standard error: the
    /// writer never waits on it; a line that finds the queue full is
    /// dropped.
    Queued(tracing_appender::non_blocking::NonBlocking),
    /// A non-blocking description of standard error (see
    /// [`never_blocking_stderr`]): a line that would block is dropped.
    NonBlocking(std::sync::Arc<std::fs::File>),
    /// Nowhere: standard error could not be made non-blocking, and a
    /// guardian must never wait on it.
    Dropped,
}

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = match self {
            LogWriter::Stderr => std::io::stderr().write_all(buf),
            LogWriter::Queued(queue) => queue.write_all(buf),
            LogWriter::NonBlocking(file) => (&**file).write_all(buf),
            LogWriter::Dropped => Ok(()),
        };
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The guardian's log lines: to a regular file as they are (a write there
/// does not wait on anyone); otherwise to standard error opened again,
/// non-blocking, so a full pipe (a reader that does not read) or a paused
/// terminal drops them instead of blocking the guardian before it acts (a
/// description of its own: O_NONBLOCK on the shared one would reach the
/// command's writes too); nowhere when that cannot be done (a socket, or a
/// pipe a pod's non-root user may not open again).
fn never_blocking_stderr() -> LogWriter {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return LogWriter::Dropped;
    };
    if meta.file_type().is_file() {
        return LogWriter::Stderr;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open("/proc/self/fd/2")
    {
        Ok(file) => LogWriter::NonBlocking(std::sync::Arc::new(file)),
        Err(_) => LogWriter::Dropped,
    }
}

/// Where log lines go.
enum LogTo {
    /// Standard error as it is (the controller: many threads, and a log
    /// that must not lose lines).
    Stderr,
    /// Through a queue ([`LogWriter::Queued`]): a participant command runs
    /// on one thread, which a full pipe or a paused terminal must never
    /// hold up while it watches a hold or a barrier.
    Queued,
    /// Dropped when they would block ([`never_blocking_stderr`]): the
    /// guardian, which must act the moment zkgate dies.
    NeverBlocking,
}

/// How many lines the queue keeps while standard error is blocked (about a
/// megabyte); more are dropped.
const QUEUED_LINES: usize = 4096;

/// Sets the log up; returns its writer, and the queue's guard (written out,
/// for a second at most, when dropped) when there is one.
fn init_logging(
    format: LogFormat,
    how: LogTo,
) -> (
    LogWriter,
    Option<tracing_appender::non_blocking::WorkerGuard>,
) {
    let filter = EnvFilter::try_from_env("ZKGATE_LOG")
        // kube's client logs each failed connection as an error of its
        // own; zkgate reports the failure, with what it was doing.
        .unwrap_or_else(|_| EnvFilter::new("zkgate=info,warn,kube_client::client::builder=off"));
    let (writer, guard) = match how {
        LogTo::Stderr => (LogWriter::Stderr, None),
        LogTo::NeverBlocking => (never_blocking_stderr(), None),
        LogTo::Queued => {
            let (queue, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .lossy(true)
                .buffered_lines_limit(QUEUED_LINES)
                .thread_name("zkgate-log")
                .finish(std::io::stderr());
            (LogWriter::Queued(queue), Some(guard))
        }
    };
    let logged = writer.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || logged.clone())
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    (writer, guard)
}
