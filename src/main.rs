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
    let args = Args::parse();
    if let Some(url) = args.healthcheck_url() {
        return healthcheck(&url);
    }
    let config = match args.into_config() {
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

/// `--healthcheck`: one request, exit 0 on 2xx, 1 otherwise.
fn healthcheck(url: &str) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("valve: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    match runtime.block_on(valve::healthcheck::check(url)) {
        Ok(status) => {
            println!("valve: {url} answered {status}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("valve: unhealthy: {e}");
            ExitCode::from(EXIT_START)
        }
    }
}

async fn run(config: Config) -> ExitCode {
    let shutdown = Shutdown::new();
    if let Err(e) = shutdown.listen_for_signals(config.drain_delay) {
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
    let admin = Admin::new(sup.clone(), &config, shutdown.signalled.clone());
    let mut admin_url = None;
    let admin_on_main = match admin_listener {
        Some(listener) => {
            if let Ok(a) = listener.local_addr() {
                tracing::info!("valve: admin pages on http://{a}/__valve__/");
                admin_url = Some(valve::server::display_addr(a));
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
    let docs = (!config.app.is_shiny()).then(|| format!("{url}/__docs__/"));
    tracing::info!(
        "valve: serving {} on {url} with {} worker(s), up to {}{}",
        config.app.path().display(),
        config.n_min,
        config.n_max,
        docs.as_deref().map(|d| format!(" (docs: {d})")).unwrap_or_default()
    );
    // The one line on stdout: for programs (the R package, tests, scripts), not people.
    let ready = serde_json::json!({
        "event": "ready",
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "url": url,
        "host": addr.ip().to_string(),
        "port": addr.port(),
        "admin_url": admin_url,
        "workers": config.n_min,
        "max_workers": config.n_max,
        "apps": [{
            "name": config.app.name(),
            "path": "/",
            "file": config.app.path(),
            "kind": if config.app.is_shiny() { "shiny" } else { "plumber" },
            "url": format!("{url}/"),
            "docs": docs,
            "n_min": config.n_min,
            "n_max": config.n_max,
        }],
    });
    println!("{ready}");
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
