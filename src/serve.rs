//! `openprogram serve`: the runtime as a long-running process on its embedded store. Startup
//! recovery runs first; SIGTERM or SIGINT starts the orderly shutdown.
//! The HTTP API, debug endpoint and page mount here with issue 8.

use std::path::PathBuf;

use crate::{Error, RestartWindow, Result, Runtime};

/// What `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data: PathBuf,
    pub restart_window: RestartWindow,
}

/// Runs until SIGTERM or SIGINT, then shuts down in order. Progress lines go to stderr.
pub async fn run(options: ServeOptions) -> Result<()> {
    // Listening before the runtime opens: a SIGTERM during startup recovery is an orderly
    // shutdown too.
    let stop = stop_signal()?;
    let runtime = Runtime::builder()
        .data_dir(&options.data)
        .restart_window(options.restart_window)
        .open()?;
    eprintln!(
        "openprogram: runtime on {} (restart window {}); SIGTERM or SIGINT stops it in order",
        options.data.display(),
        options.restart_window
    );
    tokio::pin!(stop);
    let report = tokio::select! {
        report = runtime.recovery() => report?,
        () = &mut stop => {
            eprintln!("openprogram: stopping during startup recovery");
            let stopped = runtime.shutdown().await;
            eprintln!("openprogram: stopped: {} live, {} left running", stopped.live, stopped.left_running);
            return Ok(());
        }
    };
    eprintln!(
        "openprogram: startup recovery: {} classified, {} resumed, {} expired, {} held, {} reconciling, in {} ms",
        report.classified,
        report.resumed.len(),
        report.expired.len(),
        report.held.len(),
        report.reconciling.len(),
        report.elapsed.as_millis()
    );
    stop.await;
    eprintln!("openprogram: stopping: pausing running executions for restart recovery");
    let stopped = runtime.shutdown().await;
    eprintln!(
        "openprogram: stopped: {} live, {} left running, in {} ms",
        stopped.live,
        stopped.left_running,
        stopped.elapsed.as_millis()
    );
    Ok(())
}

/// Registers for SIGTERM and SIGINT now; the future resolves at the first of them.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let unavailable = |error: std::io::Error| Error::Unavailable(format!("signals: {error}"));
    let mut terminate = signal(SignalKind::terminate()).map_err(unavailable)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(unavailable)?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
