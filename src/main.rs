//! The `valve` command: flags in, exit code out. Exit codes are decided here only:
//! 0 after a clean stop, 1 when valve or an app could not start (or requests
//! were cut off at shutdown), 2 for bad flags.

use std::process::ExitCode;
use std::sync::Arc;

use valve::config::{AppSource, Args, Command, Config, LoadError, Source};
use valve::http::server::{display_addr, Drained};
use valve::metrics::Registry;
use valve::shutdown::Shutdown;
use valve::worker::StartError;
use valve::{RunError, Serving};

const EXIT_START: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let mut args = match Args::parse_noting_given() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            if json_wanted_anyway() {
                valve::log::early_error(true, e.to_string().lines().next().unwrap_or("bad flags"));
            } else {
                let _ = e.print();
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(url) = args.healthcheck_url() {
        return healthcheck(&url);
    }
    if let Some(command) = args.command.clone() {
        return subcommand(&args, command);
    }
    let json = args.wants_json_logs();
    // What the kernel lets valve give apps (own users, a private view), known
    // before the configuration is checked against it.
    args.kernel = valve::worker::sandbox::probe(args.uid_range().0);
    valve::worker::sandbox::guard_valve();
    let loaded = args.source().map_err(LoadError::from).and_then(|source| Ok((source.load()?, source)));
    let (config, source) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            let problems = e.to_string();
            let several = problems.lines().count() > 1;
            if args.check || several {
                for line in problems.lines() {
                    valve::log::early_error(json, line);
                }
            } else {
                valve::log::early_error(json, &problems);
            }
            if args.check {
                eprintln!("valve: {} problem(s); nothing was started", problems.lines().count());
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if args.check {
        for note in config.notes.iter().chain(&config.uids.notes) {
            eprintln!("valve: note: {note}");
        }
        for warning in config.warnings() {
            eprintln!("valve: warning: {warning}");
        }
        println!("valve: {} is valid: {}", source.describe(), valve::config::summary(&config));
        print!("{}", valve::config::table(&config));
        return ExitCode::SUCCESS;
    }
    // As root, the one process that starts valve's processes, forked while
    // valve is still one thread: before the log and the runtime.
    match valve::worker::privsep::start(&config, args.uid_range(), &args.r_bin, json) {
        Ok(valve::worker::privsep::Side::Server) => {}
        Ok(valve::worker::privsep::Side::Spawner(serve)) => {
            serve();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            valve::log::early_error(json, &format!("cannot start the privileged spawner: {e}"));
            return ExitCode::from(EXIT_START);
        }
    }
    // Created before the log, which hands valve's lines about each app to that app's log.
    let registry = Arc::new(Registry::default());
    let log = valve::log::init(json, Some(valve::applog::Layer::beside_the_log(registry.logs.clone())));
    raise_descriptor_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.server.threads)
        .thread_name("valve")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("valve: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let code = runtime.block_on(serve(config, source, &log, registry));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if valve::worker::privsep::lost() {
        return ExitCode::from(EXIT_START);
    }
    code
}

/// Every client connection, spooled body and worker socket is a descriptor:
/// take all the system allows this process.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
        }
    }
}

/// Whether JSON logs were asked for in flags clap could not parse.
fn json_wanted_anyway() -> bool {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2).any(|w| w[0] == "--log-format" && w[1] == "json")
        || argv.iter().any(|a| a == "--log-format=json")
        || std::env::var("VALVE_LOG_FORMAT").is_ok_and(|v| v == "json")
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

/// `valve publish-key`, `versions`, `activate`, `access`, `packages`: 0 when done, 1
/// when valve said no (or could not be reached), 2 for bad arguments.
fn subcommand(args: &Args, command: Command) -> ExitCode {
    if let Command::PublishKey { name } = &command {
        return match valve::config::publish::new_key(name) {
            Ok((key, line)) => {
                println!("# the key: give it to {name} (rsconnect::connectApiUser(apiKey = ...) or valve_deploy(key = ...)); valve keeps only its hash");
                println!("{key}");
                println!("# the line for publish_keys_file (then valve reads the file again by itself):");
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("valve: error: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        };
    }
    let given = match &command {
        Command::Versions { admin, .. }
        | Command::Activate { admin, .. }
        | Command::Access { admin, .. }
        | Command::Packages { admin, .. } => admin,
        Command::PublishKey { .. } => &None,
    };
    let admin = match args.admin_url_for(given.as_deref()) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("valve: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let admin = match valve::admin::publish::cli::AdminAt::new(admin, &args.admin_token_path()) {
        Ok(at) => at,
        Err(e) => {
            eprintln!("valve: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("valve: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let split = |list: &Option<String>| {
        list.as_ref().map(|l| l.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
    };
    use valve::admin::publish::cli;
    let done = runtime.block_on(async {
        match &command {
            Command::Versions { app, .. } => cli::versions(&admin, app).await,
            Command::Activate { app, version, .. } => cli::activate(&admin, app, *version).await,
            Command::Access { app, users, groups, open, .. } => {
                let (users, groups) = if *open { (None, None) } else { (split(users), split(groups)) };
                cli::access(&admin, app, users, groups).await
            }
            Command::Packages { prune, .. } => cli::packages(&admin, *prune).await,
            Command::PublishKey { .. } => Ok(String::new()),
        }
    });
    match done {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("valve: error: {e}");
            ExitCode::from(EXIT_START)
        }
    }
}

async fn serve(config: Config, source: Source, log: &valve::log::Log, registry: Arc<Registry>) -> ExitCode {
    let shutdown = Shutdown::new();
    if let Err(e) = shutdown.listen_for_signals(config.server.drain_delay) {
        tracing::error!("valve: error: cannot listen for signals: {e}");
        return ExitCode::from(EXIT_START);
    }
    let dropped = log.dropped.clone();
    registry.count_log_drops(move || dropped.dropped_lines() as u64);
    let listeners = match valve::bind(&config).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("valve: error: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let result =
        valve::run(config.clone(), source, listeners, registry, shutdown, |serving| announce(&config, serving)).await;
    match result {
        Ok(Drained::Clean) => ExitCode::SUCCESS,
        Ok(Drained::Cut) => ExitCode::from(EXIT_START),
        Err(RunError::Start { app, path, error }) => {
            report_start_error(&config, &app, &path, &error);
            ExitCode::from(EXIT_START)
        }
        Err(e) => {
            tracing::error!("valve: error: {e}");
            ExitCode::from(EXIT_START)
        }
    }
}

/// Says valve serves: a sentence in the log for people, and one JSON object
/// on stdout for programs (the R package, tests, scripts).
fn announce(config: &Config, serving: &Serving) {
    let url = display_addr(serving.addr, serving.tls);
    let apps: Vec<serde_json::Value> = config
        .apps
        .iter()
        .map(|a| {
            let base = if a.prefix == "/" { format!("{url}/") } else { format!("{url}{}/", a.prefix) };
            let docs = (a.source.family() == "plumber").then(|| format!("{base}__docs__/"));
            if a.is_static() {
                tracing::info!("valve: serving the files of {} on {base} (static, no R)", a.source.path().display());
            } else {
                tracing::info!(
                    "valve: serving {} on {base} with {} worker(s), up to {}{}",
                    a.source.path().display(),
                    a.n_min,
                    a.n_max,
                    docs.as_deref().map(|d| format!(" (docs: {d})")).unwrap_or_default()
                );
            }
            serde_json::json!({
                "name": a.name,
                "path": a.prefix,
                "file": a.source.path(),
                "kind": a.source.family(),
                "url": base,
                "docs": docs,
                "n_min": a.n_min,
                "n_max": a.n_max,
            })
        })
        .collect();
    let admin_url = serving.admin.map(|a| display_addr(a, serving.admin_tls));
    if let Some(http) = serving.http {
        tracing::info!("valve: plain HTTP on {} redirects to HTTPS", display_addr(http, false));
    }
    if let Some(admin) = &admin_url {
        tracing::info!("valve: admin pages on {admin}/__valve__/");
    }
    let ready = serde_json::json!({
        "event": "ready",
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "url": url,
        "host": serving.addr.ip().to_string(),
        "port": serving.addr.port(),
        "admin_url": admin_url,
        "admin_token_file": serving.admin_token_file,
        "workers": config.apps.iter().map(|a| a.n_min).sum::<usize>(),
        "max_workers": config.server.max_workers,
        "apps": apps,
    });
    println!("{ready}");
}

fn report_start_error(config: &Config, app: &str, path: &str, e: &StartError) {
    tracing::error!(app, "valve: error: the app could not start: {e}");
    for line in e.tail() {
        tracing::error!(app, "  R: {line}");
    }
    let source = config.apps.iter().find(|a| a.name == app).map(|a| &a.source);
    let shiny = source.is_some_and(|s| s.is_shiny());
    let document = source.is_some_and(|s| matches!(s, AppSource::ShinyRmd { .. }));
    let engine = match source {
        Some(AppSource::ServerYml { engine, settings, .. }) => Some((engine.as_str(), settings.display().to_string())),
        _ => None,
    };
    let hint = match e {
        StartError::NoR { .. } | StartError::Io(_) | StartError::NoQuarto { .. } | StartError::Sandbox { .. } => return,
        _ if e.missing_package() && engine.is_some() => {
            let (engine, _) = engine.unwrap_or_default();
            format!("install the engine package into a library the workers see: R -e 'install.packages(\"{engine}\")' (or R CMD INSTALL -l LIB its source, with R_LIBS=LIB in valve's environment)")
        }
        StartError::NeverListened { .. } | StartError::Exited { .. } if engine.is_some() => {
            let (engine, settings) = engine.unwrap_or_default();
            format!("run it in R to see the problem: R -e 'get(\"launch_server\", asNamespace(\"{engine}\"))(\"{settings}\", \"127.0.0.1\", 8000L)'")
        }
        StartError::NeverListened { .. } => "raise --start-timeout if the app needs longer to load".to_string(),
        StartError::Render(r) if r.message.contains("pandoc") && !e.missing_package() => {
            "rendering needs pandoc: install it (`apt-get install pandoc`) or put it on the PATH".to_string()
        }
        _ if e.missing_package() => {
            "install R and the app's packages, e.g. `apt-get install r-base-core r-cran-plumber r-cran-shiny` (and r-cran-rmarkdown and pandoc for R Markdown documents)"
                .to_string()
        }
        StartError::Timeout(..) => "raise --start-timeout if the app needs longer to load".to_string(),
        StartError::Render(_) => {
            format!("render it in R to see the whole problem: R -e 'rmarkdown::render(\"{path}\")'")
        }
        StartError::Exited { .. } if document => {
            format!("run the document in R to see the problem: R -e 'rmarkdown::run(\"{path}\")'")
        }
        StartError::Exited { .. } if shiny => {
            format!("run the app in R to see the problem: R -e 'shiny::runApp(\"{path}\")'")
        }
        StartError::Exited { .. } => {
            format!("run the API in R to see the problem: R -e 'plumber::pr_run(plumber::pr(\"{path}\"))'")
        }
    };
    tracing::error!(app, "hint: {hint}");
}
