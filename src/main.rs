//! `sluice` command line: load and validate the config, then start Pingora.

use arc_swap::ArcSwap;
use clap::Parser;
use pingora::proxy::HttpProxy;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::ServiceHandle;
use sluice::admin::config_status::ConfigStatus;
use sluice::admin::history::{History, Sampler};
use sluice::admin::reload::Reloader;
use sluice::admin::AdminApp;
use sluice::config::{format_duration, Backend, Config, RouteAction};
use sluice::edge::drain::settle_time;
use sluice::edge::fast_stop::FastStopWatch;
use sluice::edge::front_door::FrontDoor;
use sluice::edge::proxy::Gateway;
use sluice::edge::shutdown_delay::{DelayedTerminate, Draining, ForwardStop};
use sluice::edge::warm_up::LimiterWarmUp;
use sluice::observe::access_log::{AccessLog, QUEUE_LINES};
use sluice::observe::metrics::Metrics;
use sluice::policy::state::{GatewayState, SharedState};
use sluice::rls::server::RlsListener;
use sluice::upstream::health::HealthChecks;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// glibc's malloc showed up as ~16% of the proxy's CPU under load; mimalloc
/// is markedly cheaper for the many small, short-lived request allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A reverse-proxy API gateway with exact, distributed rate limits.
#[derive(Parser, Debug)]
#[command(name = "sluice", version)]
struct Cli {
    /// Configuration file.
    #[arg(short, long, default_value = "conf/sluice.yaml")]
    config: PathBuf,
    /// Validate the configuration, print a summary and exit (0 valid, 1 invalid).
    #[arg(long)]
    check: bool,
    /// Take over the listeners of a running sluice (zero-downtime upgrade).
    #[arg(short, long)]
    upgrade: bool,
    /// Run in the background.
    #[arg(short, long)]
    daemon: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Commands other than running the gateway.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// API keys for a consumers file (`identity.api_key.store: file`):
    /// make a key and the `sha256:` line the file holds for it. Keys kept
    /// in Redis (`store: redis`) are made through the admin API instead
    /// (`POST /v1/consumers/{id}/keys`).
    #[command(subcommand)]
    Key(KeyCommand),
}

/// `sluice key ...`.
#[derive(clap::Subcommand, Debug)]
enum KeyCommand {
    /// Print a new random key, then the line the consumers file holds for it.
    New,
    /// Print the line the consumers file holds for an existing KEY.
    Hash {
        /// The key, as clients send it; `-` reads it from standard input
        /// (kept out of the shell's history and the process list).
        key: String,
    },
}

/// Runs `sluice key ...`: the key (for `new`) on one line, its
/// `sha256:` line on the next.
fn key_command(command: &KeyCommand) -> ExitCode {
    use sluice::config::consumers::{generate_key, key_line};
    match command {
        KeyCommand::New => match generate_key() {
            Ok(key) => {
                println!("{key}\n{}", key_line(key.as_bytes()));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: no random bytes from the operating system: {e}");
                ExitCode::FAILURE
            }
        },
        KeyCommand::Hash { key } => {
            let mut read = String::new();
            let key = match key.as_str() {
                "-" => match std::io::stdin().read_line(&mut read) {
                    Ok(_) => read.trim_end_matches(['\r', '\n']),
                    Err(e) => {
                        eprintln!("sluice: cannot read the key from standard input: {e}");
                        return ExitCode::FAILURE;
                    }
                },
                key => key,
            };
            println!("{}", key_line(key.as_bytes()));
            ExitCode::SUCCESS
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    if let Some(Command::Key(command)) = &cli.command {
        return key_command(command);
    }
    let loaded = match cli.check {
        true => Config::load_for_check(&cli.config),
        false => Config::load(&cli.config),
    };
    let config = match loaded {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    for warning in &config.warnings {
        if cli.check {
            eprintln!("{warning}");
        } else {
            log::warn!("{warning}");
        }
    }
    if cli.check {
        print_summary(&cli.config, &config);
        return ExitCode::SUCCESS;
    }
    match run(&cli, config) {
        Ok(never) => match never {},
        Err(message) => {
            eprintln!("sluice: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli, config: Config) -> Result<std::convert::Infallible, String> {
    let metrics = Arc::new(Metrics::new().map_err(|e| format!("metrics: {e}"))?);
    let opt = Opt {
        upgrade: cli.upgrade,
        daemon: cli.daemon,
        ..Opt::default()
    };
    let server_conf = server_conf(&config);
    let shutdown_delay = config.server.shutdown_delay;
    let admin_addr = config.server.admin.clone();
    let routes = config.routes.len();
    let threads = config.server.threads;
    // Bound now, so that a taken address stops the start with its reason;
    // an upgrade takes the running process's socket instead.
    let rls_listener = match &config.server.rls {
        Some(rls) if !cli.upgrade => Some((
            rls.listen.clone(),
            Some(
                sluice::rls::server::bind(&rls.listen)
                    .map_err(|e| format!("rate-limit service listener {}: {e}", rls.listen))?,
            ),
        )),
        Some(rls) => Some((rls.listen.clone(), None)),
        None => None,
    };

    let state = GatewayState::build(config, &metrics, None)
        .map_err(|e| format!("{}: {e}", cli.config.display()))?;
    let state: SharedState = Arc::new(ArcSwap::from_pointee(state));
    // Installed before the server starts, so that no SIGHUP is ever fatal.
    let reloader = Reloader::new(cli.config.clone(), Arc::clone(&state), Arc::clone(&metrics))
        .map_err(|e| format!("SIGHUP handler: {e}"))?;

    let fast_stop = FastStopWatch::new().map_err(|e| format!("SIGINT handler: {e}"))?;
    if cli.daemon {
        exit_on_daemon_ready().map_err(|e| format!("SIGUSR1 handler: {e}"))?;
    }
    let draining = Arc::new(Draining::default());
    let mut server = Server::new_with_opt_and_conf(opt, server_conf);
    // Bootstrap (taking the listeners over with --upgrade, then telling a
    // --daemon parent it may exit) runs as a service, after daemonizing:
    // the listeners start once it is done.
    let bootstrap = server.bootstrap_as_a_service();
    let warm_up = add_warm_up(&mut server, &state, &bootstrap);

    let (proxy, mut listening) = proxy_service(&server, &state, &metrics, &draining)?;
    if let Some((addr, bound)) = rls_listener {
        let rls = RlsListener::new(addr.clone(), bound, threads, Arc::clone(&state), &metrics);
        let rls = server.add_service(rls);
        rls.add_dependency(&bootstrap);
        rls.add_dependency(&warm_up);
        if !listening.is_empty() {
            listening.push_str(", ");
        }
        listening.push_str(&format!("rate-limit service {addr}"));
    }
    let proxy = server.add_service(proxy);
    proxy.add_dependency(&bootstrap);
    proxy.add_dependency(&warm_up);
    add_admin(
        &mut server,
        &admin_addr,
        &state,
        metrics,
        reloader.status(),
        &bootstrap,
        Arc::clone(&draining),
    );
    server.add_service(background_service("sluice reload", reloader));
    server.add_service(background_service("sluice fast stop", fast_stop));
    add_stop_and_health(&mut server, state, &draining);

    log::info!("sluice listening on {listening} (admin {admin_addr}), {routes} routes");
    let shutdown_signal = Box::new(DelayedTerminate::new(shutdown_delay, draining));
    server.run(RunArgs { shutdown_signal });
    std::process::exit(0)
}

/// Adds the task that passes Pingora's own stop on to the connections'
/// watch (`draining`), and the upstreams' health checks.
fn add_stop_and_health(server: &mut Server, state: SharedState, draining: &Arc<Draining>) {
    server.add_service(background_service(
        "sluice stop forwarding",
        ForwardStop(Arc::clone(draining)),
    ));
    server.add_service(background_service(
        "sluice health checks",
        HealthChecks::new(move || state.load().upstreams.clone()),
    ));
}

/// Adds the admin listener on `addr` (started after `bootstrap`), and the
/// task that reads the counters its console charts.
fn add_admin(
    server: &mut Server,
    addr: &str,
    state: &SharedState,
    metrics: Arc<Metrics>,
    config_status: Arc<ConfigStatus>,
    bootstrap: &ServiceHandle,
    draining: Arc<Draining>,
) {
    let history = Arc::new(History::new());
    let app = AdminApp::new(
        Arc::clone(&metrics),
        Arc::clone(state),
        config_status,
        Arc::clone(&history),
        draining,
    );
    let mut admin = Service::new("sluice admin".to_string(), app);
    admin.add_tcp(addr);
    admin.threads = Some(1);
    server.add_service(admin).add_dependency(bootstrap);
    server.add_service(background_service(
        "sluice console history",
        Sampler::new(history, Arc::clone(state), metrics),
    ));
}

/// Adds the service that connects the limiter to Redis (within its connect
/// budget) after `bootstrap`; the proxy's and the rate-limit service's
/// listeners depend on it, so the first request is decided by Redis, not by
/// a fallback.
fn add_warm_up(
    server: &mut Server,
    state: &SharedState,
    bootstrap: &ServiceHandle,
) -> ServiceHandle {
    let warm_up = server.add_service(background_service(
        "sluice limiter connect",
        LimiterWarmUp::new(Arc::clone(state)),
    ));
    warm_up.add_dependency(bootstrap);
    warm_up
}

/// Pingora's settings from `config.server`.
fn server_conf(config: &Config) -> ServerConf {
    ServerConf {
        threads: config.server.threads,
        work_stealing: config.server.work_stealing,
        grace_period_seconds: Some(config.server.grace_period.as_secs_f64().ceil() as u64),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: config.server.pid_file.clone(),
        upgrade_sock: config.server.upgrade_sock.clone(),
        // With --daemon, the starting process exits only once the daemon has
        // bootstrapped (listeners bound or taken over): what systemd's
        // Type=forking needs to know the service is up.
        daemon_wait_for_ready: true,
        daemon_ready_timeout_seconds: std::num::NonZeroU64::new(60),
        ..ServerConf::default()
    }
}

/// The gateway behind its front door, as a listening service.
type ProxyService = Service<FrontDoor<HttpProxy<Gateway>>>;

/// The proxy service on every plain and TLS listener of the starting
/// configuration, behind the front door; and the listeners, for the log.
fn proxy_service(
    server: &Server,
    state: &SharedState,
    metrics: &Arc<Metrics>,
    draining: &Arc<Draining>,
) -> Result<(ProxyService, String), String> {
    let config = &state.load().config;
    let access_log = AccessLog::new(QUEUE_LINES, metrics.access_log_dropped.clone());
    let mut proxy_app = pingora::proxy::http_proxy(
        &server.configuration,
        Gateway::new(
            Arc::clone(state),
            Arc::clone(metrics),
            access_log,
            Arc::clone(draining),
        ),
    );
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2c = config.server.h2c;
    // An HTTP/2 connection without a stream in progress is idle, like a
    // kept-alive HTTP/1.1 one between requests (whose timeout the front
    // door keeps, reloadably); Pingora closes it, with the value at start.
    options.h2_idle_timeout = Some(config.server.front_door.keepalive_timeout);
    proxy_app.server_options = Some(options);
    let front_door = FrontDoor::new(
        proxy_app,
        settle_time(config.server.grace_period),
        Arc::clone(state),
        Arc::clone(metrics),
    )
    .following(draining.connections());
    let handshake_guard = Arc::new(front_door.handshake_guard());
    let mut proxy = Service::new("sluice proxy".to_string(), front_door);
    // Only the TLS listeners call it.
    proxy.endpoints().set_pre_tls_callback(handshake_guard);
    for addr in &config.server.listen {
        proxy.add_tcp(addr);
    }
    let mut listening = config.server.listen.join(", ");
    for listener in &config.server.tls {
        let addr = &listener.listen;
        let settings = sluice::edge::tls::listener_settings(Arc::clone(state), addr)
            .map_err(|e| format!("TLS listener {addr}: {e}"))?;
        proxy.add_tls_with_settings(addr, None, settings);
        listening.push_str(&format!(", TLS {addr}"));
    }
    Ok((proxy, listening))
}

/// With `--daemon`, Pingora's starting process waits for the daemon's
/// `SIGUSR1` ("bootstrapped") before it exits 0 — but it installs its handler
/// only after forking, so a daemon that bootstraps quickly signals a process
/// with no handler, which the signal then kills (seen under load: the
/// `--daemon` command died of SIGUSR1). Installing the exit here, before the
/// fork, closes that window: whenever `SIGUSR1` arrives, the process exits 0.
/// The daemon inherits the handler; nothing else sends it `SIGUSR1`, whose
/// default action ends the process anyway.
fn exit_on_daemon_ready() -> std::io::Result<()> {
    // SAFETY: the action only calls `_exit`, which is async-signal-safe; it
    // allocates, locks and touches nothing.
    unsafe {
        signal_hook::low_level::register(signal_hook::consts::SIGUSR1, || {
            signal_hook::low_level::exit(0)
        })?;
    }
    Ok(())
}

/// Prints the `--check` summary in one write; a closed stdout (`| head`)
/// is not an error worth a panic.
fn print_summary(path: &std::path::Path, config: &Config) {
    use std::io::Write as _;
    let text = summary(path, config);
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn summary(path: &std::path::Path, config: &Config) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let limits: usize = config.routes.iter().map(|r| r.limits.len()).sum();
    let _ = writeln!(
        out,
        "{}: OK — {}, {}, {}",
        path.display(),
        count(config.routes.len(), "route"),
        count(limits, "limit"),
        count(config.upstreams.len(), "upstream")
    );
    let _ = writeln!(
        out,
        "  listen {}{} · admin {}",
        if config.server.listen.is_empty() {
            "none".to_string()
        } else {
            config.server.listen.join(", ")
        },
        if config.server.h2c { " (h2c too)" } else { "" },
        config.server.admin
    );
    for listener in &config.server.tls {
        let _ = writeln!(
            out,
            "  tls {} ({}), HTTP/2 and HTTP/1.1",
            listener.listen,
            count(listener.certs.len(), "certificate")
        );
    }
    limiter_summary(&mut out, config);
    rls_summary(&mut out, config);
    for route in &config.routes {
        let target = match &route.action {
            RouteAction::Upstream(i) => format!("→ {}", config.upstreams[*i].name),
            RouteAction::Respond { status, .. } => format!("→ respond {status}"),
        };
        let _ = writeln!(out, "  route {} {target}", route.name);
        for limit in &route.limits {
            let _ = writeln!(out, "    limit {}: {}", limit.name, limit.describe());
        }
    }
    out
}

/// The `--check` summary's lines on the rate-limit service: its listener,
/// its rules files and each domain's limits.
fn rls_summary(out: &mut String, config: &Config) {
    use std::fmt::Write as _;
    let Some(rls) = &config.server.rls else {
        return;
    };
    let rules = &rls.rules;
    let _ = writeln!(
        out,
        "  rate-limit service {}{} · {} from {} ({}) · default {}",
        rls.listen,
        if rls.tls.is_some() {
            " (TLS)"
        } else {
            " (h2c)"
        },
        count(rules.domains.len(), "domain"),
        rls.config_path,
        count(rules.files.len(), "file"),
        rls.algorithm.name()
    );
    let mut domains: Vec<&String> = rules.domains.keys().collect();
    domains.sort();
    for domain in domains {
        let _ = writeln!(out, "    domain {domain}");
        for limit in rules.limits.iter().filter(|l| &l.domain == domain) {
            let _ = writeln!(out, "      limit {}: {}", limit.label, limit.describe());
        }
    }
}

/// The `--check` summary's lines on the limiter: its backend, the deny
/// cache and the in-process limiter.
fn limiter_summary(out: &mut String, config: &Config) {
    use std::fmt::Write as _;
    if let Some(sentinel) = &config.limiter.redis.sentinel {
        let _ = writeln!(
            out,
            "  redis sentinel master {} via {}",
            sentinel.master,
            sentinel.nodes.join(", ")
        );
    }
    let _ = match config.limiter.backend {
        Backend::Redis => writeln!(
            out,
            "  limiter redis {} (timeout {}, on_error {})",
            if config.limiter.redis.cluster.is_empty() {
                redact(&config.limiter.redis.url)
            } else {
                let nodes: Vec<String> = config
                    .limiter
                    .redis
                    .cluster
                    .iter()
                    .map(|u| redact(u))
                    .collect();
                format!("cluster [{}]", nodes.join(", "))
            },
            format_duration(config.limiter.redis.timeout),
            config.limiter.on_error.name()
        ),
        Backend::Local => writeln!(out, "  limiter local (this instance only)"),
    };
    let _ = writeln!(
        out,
        "  deny cache {}, in-process limiter {} keys{}",
        if config.limiter.deny_cache {
            "on"
        } else {
            "off"
        },
        config.limiter.local_max_keys,
        if config.limiter.local_share < 1.0 {
            format!(", fallback share {:.3}", config.limiter.local_share)
        } else {
            String::new()
        }
    );
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Hides a password in a Redis URL.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(start), Some(at)) if at > start => format!("{}***{}", &url[..start + 3], &url[at..]),
        _ => url.to_string(),
    }
}
