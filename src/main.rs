//! The `valve` command: flags in, exit code out. Exit codes are decided here only:
//! 0 after a clean stop, 1 when valve or the API could not start (or requests
//! were cut off at shutdown), 2 for bad flags.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;
use valve::admin::Admin;
use valve::config::{Args, Config};
use valve::server::Drained;
use valve::shutdown::Shutdown;
use valve::supervisor::Supervisor;
use valve::worker::StartError;

const EXIT_START: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// How often the start-up reports progress while the first workers load.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let config = match Args::parse().into_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("valve: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let filter = EnvFilter::try_from_env("VALVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if config.log_json {
        logs.json().with_current_span(false).init();
    } else {
        logs.with_target(false).init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .thread_name("valve")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("valve: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: Config) -> ExitCode {
    let shutdown = Shutdown::new();
    if let Err(e) = shutdown.listen_for_signals() {
        eprintln!("valve: error: cannot listen for signals: {e}");
        return ExitCode::from(EXIT_START);
    }
    let listener = match TcpListener::bind((config.host.as_str(), config.port)).await {
        Ok(l) => l,
        Err(e) => {
            let hint = match e.kind() {
                std::io::ErrorKind::AddrInUse => " (another program uses it: stop it or pick another --port)",
                std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges: pick a --port above 1024)",
                _ => " (check --host and --port)",
            };
            eprintln!("valve: error: cannot listen on {}:{}: {e}{hint}", config.host, config.port);
            return ExitCode::from(EXIT_START);
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("valve: error: cannot read the bound address: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let admin_listener = match &config.admin_addr {
        None => None,
        Some(admin_addr) => match TcpListener::bind(admin_addr.as_str()).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("valve: error: cannot listen on --admin-addr {admin_addr}: {e} (pick another HOST:PORT)");
                return ExitCode::from(EXIT_START);
            }
        },
    };
    let sup = match Supervisor::new(&config, addr.port()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("valve: error: cannot create the private run directory: {e} (check TMPDIR)");
            return ExitCode::from(EXIT_START);
        }
    };
    let admin = Admin::new(sup.clone(), &config, shutdown.drain.clone());
    let admin_on_main = match admin_listener {
        Some(listener) => {
            if let Ok(a) = listener.local_addr() {
                println!("valve: admin pages on http://{a}/__valve__/");
            }
            valve::server::serve_admin(listener, admin);
            None
        }
        None => Some(admin),
    };
    tokio::spawn(sup.clone().history_loop(shutdown.now.clone()));
    // Serve at once: health checks answer while workers start, requests wait for them.
    let server =
        tokio::spawn(valve::server::run(listener, sup.clone(), shutdown.clone(), config.clone(), admin_on_main));

    tracing::info!(app = %config.app.path().display(), workers = config.n_min, preload = config.preload, "starting workers");
    let started = Instant::now();
    let start = sup.start();
    tokio::pin!(start);
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            result = &mut start => match result {
                Ok(()) => break,
                Err(e) => {
                    report_start_error(&config, &e);
                    sup.shutdown().await;
                    return ExitCode::from(EXIT_START);
                }
            },
            _ = progress.tick() => {
                let g = sup.gauges();
                tracing::info!(ready = g.idle + g.busy, wanted = config.n_min, waited_s = started.elapsed().as_secs(),
                    "still starting workers");
            }
            _ = shutdown.drain.cancelled() => {
                sup.shutdown().await;
                return ExitCode::SUCCESS;
            }
        }
    }
    let url = valve::server::display_addr(addr);
    let docs = if config.app.is_shiny() { String::new() } else { format!(" (docs: {url}/__docs__/)") };
    println!(
        "valve: serving {} on {url} with {} worker(s), up to {}{docs}",
        config.app.path().display(),
        config.n_min,
        config.n_max
    );
    match server.await {
        Ok(Drained::Clean) => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_START),
    }
}

fn report_start_error(config: &Config, e: &StartError) {
    eprintln!("valve: error: the API could not start: {e}");
    for line in e.tail() {
        eprintln!("  R: {line}");
    }
    let hint = match e {
        StartError::NoR { .. } | StartError::Io(_) => return,
        _ if e.missing_package() => {
            "install R and plumber, e.g. `apt-get install r-base-core r-cran-plumber`".to_string()
        }
        StartError::Timeout(..) => "raise --start-timeout if the API needs longer to load".to_string(),
        StartError::Exited { .. } => format!(
            "run the API in R to see the problem: R -e 'plumber::pr_run(plumber::pr(\"{}\"))'",
            config.app.path().display()
        ),
    };
    eprintln!("hint: {hint}");
}
