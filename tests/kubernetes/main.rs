//! The Kubernetes manifests (deploy/kubernetes): every overlay renders and
//! passes the Kubernetes schemas of three versions and the custom
//! resources' schemas; the Deployment keeps its hardening in every overlay;
//! each overlay's configuration passes `--check` in the pod's own
//! filesystem; and the release binary runs as the Deployment runs it — its
//! user, no capabilities, a read-only root, its probes, its environment,
//! its ConfigMap updated by a `..data` swap — and stops cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

#[path = "../common/mod.rs"]
mod common;
mod manifests;
mod pod;

use common::*;
use manifests::{at, seq, str_at, Rendered, OVERLAYS};
use pod::Pod;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

// ------------------------------------------------------------------ schemas

/// scripts/check-manifests on `text`: (passed, its report).
fn check_manifests(text: &str) -> (bool, String) {
    let mut child = Command::new(Path::new(ROOT).join("scripts/check-manifests"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/check-manifests (python3; pip install kubernetes-validate)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), report)
}

#[test]
fn every_overlay_renders_and_passes_the_schemas() {
    for overlay in OVERLAYS {
        let rendered = Rendered::of(overlay);
        let (passed, report) = check_manifests(&rendered.text);
        assert!(passed, "{overlay}:\n{report}");
        assert!(
            report.contains("Kubernetes 1."),
            "{overlay}: no version named:\n{report}"
        );
        let objects = rendered.objects.len();
        assert!(
            report.contains(&format!("{objects} object(s), 0 failed")),
            "{overlay}:\n{report}"
        );
    }
    // The check can fail: a misspelt field of a built-in kind and of a
    // custom resource are each refused, in every version.
    let base = Rendered::of("base").text;
    let typo = base.replace("readOnlyRootFilesystem", "readOnlyRootFilesytem");
    let (passed, report) = check_manifests(&typo);
    assert!(
        !passed && report.matches("readOnlyRootFilesytem").count() == 3,
        "{report}"
    );
    let monitoring = Rendered::of("overlays/monitoring").text;
    let typo = monitoring.replace("scrapeTimeout", "scrapeTimeOut");
    let (passed, report) = check_manifests(&typo);
    assert!(
        !passed && report.contains("ServiceMonitor/sluice") && report.contains("scrapeTimeOut"),
        "{report}"
    );
    // And a kind no schema knows is not waved through.
    let (passed, report) =
        check_manifests("apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: x}\n");
    assert!(!passed, "{report}");
}

#[test]
fn the_prometheus_rule_holds_the_compose_stacks_alert_rules() {
    let rendered = Rendered::of("overlays/monitoring");
    let rule = rendered.get("PrometheusRule", "sluice");
    let alerts: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("docker/alerts.yml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        at(rule, "spec.groups"),
        at(&alerts, "groups"),
        "deploy/kubernetes/components/monitoring/prometheusrule.yaml differs from docker/alerts.yml"
    );
    let dashboards = rendered.get("ConfigMap", "sluice-dashboards");
    assert_eq!(
        str_at(dashboards, "metadata.labels.grafana_dashboard"),
        Some("1")
    );
    let shipped =
        std::fs::read_to_string(Path::new(ROOT).join("docker/grafana/sluice-dashboard.json"))
            .unwrap();
    let files = rendered.config_map_files("sluice-dashboards");
    assert!(
        files
            .iter()
            .any(|(k, v)| k == "sluice.json" && *v == shipped),
        "the dashboard as shipped"
    );
    // The job label the rules and the dashboard expect.
    let monitor = rendered.get("ServiceMonitor", "sluice");
    let job_label = str_at(monitor, "spec.jobLabel").unwrap();
    let admin = rendered.get("Service", "sluice-admin");
    let job = at(admin, "metadata.labels")
        .get(job_label)
        .and_then(|v| v.as_str());
    assert_eq!(job, Some("sluice"), "the admin Service's {job_label}");
}

// ---------------------------------------------------------------- hardening

/// A duration of the config (`10s`, `1m`, `500ms`) in milliseconds.
fn millis(text: &str) -> u64 {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("duration {text}"));
    number
        * match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            _ => panic!("duration unit in {text}"),
        }
}

/// What `rendered` lacks of the hardening every overlay must keep; empty
/// when nothing is missing.
fn missing_hardening(rendered: &Rendered) -> Vec<String> {
    let mut missing = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            missing.push(what.to_string());
        }
    };
    let deployment = rendered.deployment();
    let pod = at(deployment, "spec.template.spec");
    let container = rendered.container();
    let either = |key: &str| {
        let own = at(container, &format!("securityContext.{key}"));
        if own.is_null() {
            at(pod, &format!("securityContext.{key}")).clone()
        } else {
            own.clone()
        }
    };
    need(
        either("runAsNonRoot").as_bool() == Some(true),
        "runAsNonRoot: true",
    );
    need(
        either("runAsUser").as_u64().is_some_and(|u| u > 0),
        "a fixed non-root runAsUser",
    );
    need(
        either("seccompProfile")
            .get("type")
            .and_then(|t| t.as_str())
            == Some("RuntimeDefault"),
        "seccompProfile RuntimeDefault",
    );
    let security = at(container, "securityContext");
    need(
        at(security, "readOnlyRootFilesystem").as_bool() == Some(true),
        "readOnlyRootFilesystem: true",
    );
    need(
        at(security, "allowPrivilegeEscalation").as_bool() == Some(false),
        "allowPrivilegeEscalation: false",
    );
    need(
        at(security, "privileged").as_bool() != Some(true),
        "not privileged",
    );
    need(
        seq(at(security, "capabilities.drop"))
            .iter()
            .any(|c| c.as_str() == Some("ALL")),
        "capabilities drop ALL",
    );
    need(
        seq(at(security, "capabilities.add")).is_empty(),
        "no capabilities added",
    );
    need(
        at(pod, "automountServiceAccountToken").as_bool() == Some(false),
        "no service account token mounted",
    );
    for resource in ["requests.cpu", "requests.memory", "limits.memory"] {
        need(
            !at(container, &format!("resources.{resource}")).is_null(),
            &format!("resources.{resource}"),
        );
    }
    let admin = rendered.container_port("admin");
    for (probe, path) in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = at(container, &format!("{probe}.httpGet"));
        let port_ok =
            str_at(get, "port") == Some("admin") || at(get, "port").as_u64() == Some(admin.into());
        need(
            str_at(get, "path") == Some(path) && port_ok,
            &format!("{probe} on the admin port's {path}"),
        );
    }
    need(
        at(deployment, "spec.replicas")
            .as_u64()
            .is_some_and(|r| r >= 2),
        "at least 2 replicas",
    );
    need(
        at(deployment, "spec.strategy.rollingUpdate.maxUnavailable").as_u64() == Some(0),
        "maxUnavailable: 0",
    );
    let spread = seq(at(pod, "topologySpreadConstraints"));
    need(
        spread
            .iter()
            .any(|c| str_at(c, "topologyKey") == Some("kubernetes.io/hostname")),
        "spread across nodes",
    );
    for volume in seq(at(pod, "volumes")) {
        let empty_dir = at(volume, "emptyDir");
        need(
            empty_dir.is_null() || !at(empty_dir, "sizeLimit").is_null(),
            "a sizeLimit on every emptyDir",
        );
    }
    let config: serde_yaml::Value =
        serde_yaml::from_str(&rendered.sluice_yaml()).expect("sluice.yaml");
    let delay = str_at(&config, "server.shutdown_delay").map_or(0, millis);
    let grace = str_at(&config, "server.grace_period").map_or(5_000, millis);
    need(delay > 0, "server.shutdown_delay set");
    let termination = at(pod, "terminationGracePeriodSeconds")
        .as_u64()
        .unwrap_or(30)
        * 1000;
    need(
        termination > delay + grace,
        "terminationGracePeriodSeconds above shutdown_delay + grace_period",
    );
    need(
        at(&config, "server.watch_config").as_bool() == Some(true),
        "watch_config: true",
    );
    let labels = at(deployment, "spec.template.metadata.labels");
    let selects_pods = |o: &serde_yaml::Value| {
        at(o, "spec.selector.matchLabels")
            .as_mapping()
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    };
    let pdb = rendered
        .objects
        .iter()
        .find(|o| str_at(o, "kind") == Some("PodDisruptionBudget"));
    need(
        pdb.is_some_and(selects_pods),
        "a PodDisruptionBudget for the pods",
    );
    let hpa = rendered.find("HorizontalPodAutoscaler", "sluice");
    need(
        hpa.is_some_and(|h| str_at(h, "spec.scaleTargetRef.name") == Some("sluice")),
        "a HorizontalPodAutoscaler",
    );
    let account = rendered.find("ServiceAccount", "sluice");
    need(
        account.is_some_and(|a| at(a, "automountServiceAccountToken").as_bool() == Some(false)),
        "a ServiceAccount without a token",
    );
    need(
        admin_port_only_from_monitoring(rendered),
        "a NetworkPolicy: the admin port only from the monitoring namespace",
    );
    missing
}

/// Whether the NetworkPolicy lets only the `monitoring` namespace reach
/// the admin port: every ingress rule that opens it names that namespace
/// and nothing wider.
fn admin_port_only_from_monitoring(rendered: &Rendered) -> bool {
    let Some(policy) = rendered.find("NetworkPolicy", "sluice") else {
        return false;
    };
    let admin = rendered.container_port("admin");
    let opens_admin = |rule: &serde_yaml::Value| {
        let ports = seq(at(rule, "ports"));
        ports.is_empty()
            || ports.iter().any(|p| {
                str_at(p, "port") == Some("admin") || at(p, "port").as_u64() == Some(admin.into())
            })
    };
    let from_monitoring_only = |rule: &serde_yaml::Value| {
        let from = seq(at(rule, "from"));
        !from.is_empty()
            && from.iter().all(|f| {
                let labels = at(f, "namespaceSelector.matchLabels");
                let namespace = labels
                    .get("kubernetes.io/metadata.name")
                    .and_then(|v| v.as_str());
                namespace == Some("monitoring")
                    && at(f, "podSelector").is_null()
                    && at(f, "ipBlock").is_null()
            })
    };
    let rules = seq(at(policy, "spec.ingress"));
    rules.iter().any(opens_admin)
        && rules
            .iter()
            .filter(|r| opens_admin(r))
            .all(from_monitoring_only)
}

#[test]
fn the_deployment_keeps_its_hardening_in_every_overlay() {
    for overlay in OVERLAYS {
        let rendered = Rendered::of(overlay);
        let missing = missing_hardening(&rendered);
        assert!(missing.is_empty(), "{overlay} lacks: {missing:?}");
        // The image is this version's (a release bumps both).
        let image = str_at(rendered.container(), "image");
        assert_eq!(
            image,
            Some(concat!("sluice:", env!("CARGO_PKG_VERSION"))),
            "{overlay}"
        );
    }
    // The checklist can fail: each field taken out is reported.
    let base = Rendered::of("base");
    for (field, replacement, reported) in [
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: false",
            "readOnlyRootFilesystem: true",
        ),
        (
            "maxUnavailable: 0",
            "maxUnavailable: 1",
            "maxUnavailable: 0",
        ),
        ("- ALL", "- NET_RAW", "capabilities drop ALL"),
        (
            "terminationGracePeriodSeconds: 35",
            "terminationGracePeriodSeconds: 20",
            "terminationGracePeriodSeconds above",
        ),
        (
            "type: RuntimeDefault",
            "type: Unconfined",
            "seccompProfile RuntimeDefault",
        ),
        (
            "kubernetes.io/metadata.name: monitoring",
            "kubernetes.io/metadata.name: default",
            "NetworkPolicy",
        ),
        (
            "kind: PodDisruptionBudget",
            "kind: PodDisruptionBudgetX",
            "PodDisruptionBudget",
        ),
    ] {
        assert!(
            base.text.contains(field),
            "the rendered base has no `{field}`"
        );
        let broken = Rendered::from_text("base, altered", &base.text.replace(field, replacement));
        let missing = missing_hardening(&broken);
        assert!(
            missing.iter().any(|m| m.contains(reported)),
            "{field} → {replacement}: {missing:?}"
        );
    }
}

// --------------------------------------------------------------- in the pod

/// The release binary, built as CI and the image build it (a no-op when
/// it is up to date), in the target directory of this test.
fn release_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let debug = Path::new(env!("CARGO_BIN_EXE_sluice"));
        let target = debug
            .parent()
            .and_then(Path::parent)
            .expect("target directory");
        let mut cargo = Command::new(option_env!("CARGO").unwrap_or("cargo"));
        // What cargo tells this test about its own package would make the
        // build scripts that watch it (ring's) rebuild here, and the next
        // plain `cargo build --release` rebuild again.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            let prefixes = [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_BIN_",
                "CARGO_CRATE_",
                "CARGO_PRIMARY_",
            ];
            let about_this_test = prefixes.iter().any(|p| name.starts_with(p))
                || ["CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR", "OUT_DIR"]
                    .contains(&name.as_str());
            if about_this_test {
                cargo.env_remove(&name);
            }
        }
        let status = cargo
            .args([
                "build",
                "--release",
                "--locked",
                "--bin",
                "sluice",
                "--target-dir",
            ])
            .arg(target)
            .current_dir(ROOT)
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build --release failed");
        target.join("release/sluice")
    })
}

/// What the downward API gives the pod.
const FIELDS: [(&str, &str); 2] = [
    ("metadata.name", "sluice-5d8f7c9b4-x2x7q"),
    ("metadata.namespace", "sluice"),
];

/// A CA certificate (PEM) for the production overlay's Redis TLS Secret.
fn test_ca() -> String {
    let dir = tempfile::tempdir().unwrap();
    let status = installed("openssl", "openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
        ])
        .args(["-subj", "/CN=redis test CA", "-keyout"])
        .arg(dir.path().join("ca.key"))
        .arg("-out")
        .arg(dir.path().join("ca.crt"))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read_to_string(dir.path().join("ca.crt")).unwrap()
}

#[test]
fn each_overlays_configuration_passes_check_in_the_pod() {
    let binary = release_binary();
    let ca = test_ca();
    let secrets = [
        (
            "sluice-redis",
            "url",
            "rediss://sluice:s3cret@redis.example.internal:6380/0",
        ),
        ("sluice-redis-tls", "ca.crt", ca.as_str()),
        ("sluice-admin", "token", "a-token"),
    ];
    for overlay in OVERLAYS {
        let rendered = Rendered::of(overlay);
        let pod = Pod::new(&rendered, &secrets, &FIELDS);
        let args: Vec<String> = std::iter::once("--check".to_string())
            .chain(pod.args.clone())
            .collect();
        let output = pod.command_with_args(binary, &args).output().unwrap();
        let report = String::from_utf8_lossy(&output.stdout);
        let errors = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && report.contains(": OK"),
            "{overlay}:\n{report}{errors}"
        );
        assert!(
            !errors.contains("warning:"),
            "{overlay}: the configuration warns:\n{errors}"
        );
        // Every port the container declares is one the configuration opens
        // in the pod, and every probe asks the admin listener.
        let opens = |name: &str, port: u16| match name {
            "http" => report.contains(&format!("listen 0.0.0.0:{port}")),
            "admin" => report.contains(&format!("admin 0.0.0.0:{port}")),
            "grpc-rls" => report.contains(&format!("rate-limit service 0.0.0.0:{port} ")),
            _ => false,
        };
        for port in seq(at(rendered.container(), "ports")) {
            let name = str_at(port, "name").expect("every container port is named");
            let number = rendered.container_port(name);
            assert!(
                opens(name, number),
                "{overlay}: port {name} ({number}) is not opened:\n{report}"
            );
        }
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            assert_eq!(
                str_at(rendered.container(), &format!("{probe}.httpGet.port")),
                Some("admin"),
                "{overlay} {probe}"
            );
        }
        assert_env_is_known(overlay, &rendered, &pod);
    }
}

/// Variables sluice reads itself, besides those its configuration names.
const READ_BY_THE_BINARY: [&str; 2] = ["RUST_LOG", "OTEL_RESOURCE_ATTRIBUTES"];

/// Every variable of the Deployment is one sluice reads: named by its
/// configuration (`${NAME}`, `admin_token_env`), read by the binary
/// itself, or used by another variable (`$(NAME)`, the kubelet's).
fn assert_env_is_known(overlay: &str, rendered: &Rendered, pod: &Pod) {
    let config = rendered.sluice_yaml();
    let named = |name: &str| {
        config.contains(&format!("${{{name}}}"))
            || config.contains(&format!("${{{name}:-"))
            || config.contains(&format!("admin_token_env: {name}"))
    };
    let declared = seq(at(rendered.container(), "env"));
    for (name, _) in &pod.env {
        let used_by_another = declared
            .iter()
            .filter_map(|v| str_at(v, "value"))
            .any(|v| v.contains(&format!("$({name})")));
        assert!(
            named(name) || READ_BY_THE_BINARY.contains(&name.as_str()) || used_by_another,
            "{overlay}: the Deployment sets {name}, which nothing reads"
        );
    }
}

/// The pod's listeners moved to free ports (this machine's network is
/// shared), through the variables the configuration reads them from — in
/// the pod they are unset and the defaults are the container ports. They
/// listen on every address, as in the pod; the test reaches them on
/// loopback.
fn listen_on_free_ports(pod: &mut Pod) -> (SocketAddr, SocketAddr) {
    let (port, admin_port) = (free_port(), free_port());
    for (name, _) in &pod.env {
        assert!(
            name != "SLUICE_LISTEN" && name != "SLUICE_ADMIN",
            "the Deployment sets {name}"
        );
    }
    pod.env
        .push(("SLUICE_LISTEN".into(), format!("0.0.0.0:{port}")));
    pod.env
        .push(("SLUICE_ADMIN".into(), format!("0.0.0.0:{admin_port}")));
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    (loopback(port), loopback(admin_port))
}

/// The kubelet's probes of the container, asked as it asks them: each on
/// the admin listener, the startup probe until it passes within its
/// budget, then readiness and liveness once.
fn ask_probes(rendered: &Rendered, admin: SocketAddr, child: &mut std::process::Child, log: &Path) {
    let container = rendered.container();
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let spec = at(container, probe);
        let path = str_at(spec, "httpGet.path").unwrap_or_else(|| panic!("{probe}: no httpGet"));
        assert_eq!(
            str_at(spec, "httpGet.port"),
            Some("admin"),
            "{probe} asks the admin port"
        );
        let budget = at(spec, "periodSeconds").as_u64().unwrap_or(10)
            * at(spec, "failureThreshold").as_u64().unwrap_or(3);
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "sluice exited ({status}):\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            let status = std::net::TcpStream::connect(admin)
                .ok()
                .map(|_| get(admin, path, &[]).status);
            if status.is_some_and(|s| (200..400).contains(&s)) {
                break;
            }
            assert!(probe == "startupProbe", "{probe} {path}: {status:?}");
            assert!(
                start.elapsed() < Duration::from_secs(budget),
                "{probe} failed for {budget} s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn the_release_binary_runs_as_the_deployment_runs_it() {
    let binary = release_binary();
    let rendered = Rendered::of("overlays/try");
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let url = redis.url();
    let secrets = [
        ("sluice-redis", "url", url.as_str()),
        ("sluice-admin", "token", "k8s-token"),
    ];
    let mut pod = Pod::new(&rendered, &secrets, &FIELDS);
    let (addr, admin) = listen_on_free_ports(&mut pod);
    pod.env
        .push(("SLUICE_UPSTREAM".into(), upstream.addr.to_string()));
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = pod
        .command(binary)
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let _stop = KillOnDrop(child.id());
    ask_probes(&rendered, admin, &mut child, log.path());
    assert_runs_confined(child.id(), &rendered);

    // It serves, and limits through Redis: the demo route's 5 per 10 s.
    let statuses: Vec<u16> = (0..6).map(|_| get(addr, "/demo", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert!(!redis.keys("sluice:*").is_empty(), "no counter in Redis");
    assert_eq!(get(addr, "/orders/7", &[]).status, 200);
    assert_eq!(upstream.hits(), 1);
    // It says which pod it is.
    let status = get(
        admin,
        "/v1/status",
        &[("Authorization", "Bearer k8s-token")],
    );
    assert!(
        status.body.contains("sluice-5d8f7c9b4-x2x7q")
            && status.body.contains("\"namespace\":\"sluice\""),
        "{}",
        status.body
    );
    let access_log = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        access_log.contains("\"pod\":\"sluice-5d8f7c9b4-x2x7q\""),
        "{access_log}"
    );

    // The ConfigMap changes: the kubelet swaps `..data`, sluice reloads
    // (watch_config) and keeps its counters — 5 used of a new 50.
    let before = rendered.sluice_yaml();
    let after = before.replace("limit: 5, window: 10s", "limit: 50, window: 10s");
    assert_ne!(before, after, "the demo limit is where the test expects it");
    pod.update_config_map("sluice", &[("sluice.yaml".to_string(), after)]);
    let reloads = || {
        metric_value(
            &get(admin, "/metrics", &[]).body,
            "sluice_config_reloads_total{result=\"success\"} ",
        )
    };
    wait_until(
        Duration::from_secs(20),
        "the ConfigMap's update to reload",
        || reloads() == 1,
    );
    let usage = get(
        admin,
        "/v1/usage?route=demo&limit=per-ip&ip=127.0.0.1",
        &[("Authorization", "Bearer k8s-token")],
    );
    assert!(
        usage.body.contains("\"used\":5") && usage.body.contains("\"quota\":50"),
        "{}",
        usage.body
    );
    assert_eq!(get(addr, "/demo", &[]).status, 200);

    // SIGTERM, as the kubelet stops it: not ready at once, still serving
    // through shutdown_delay, then a clean exit within the grace period.
    let config: serde_yaml::Value = serde_yaml::from_str(&before).unwrap();
    let delay = Duration::from_millis(millis(str_at(&config, "server.shutdown_delay").unwrap()));
    let grace = Duration::from_millis(millis(str_at(&config, "server.grace_period").unwrap()));
    let stopped = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    wait_until(Duration::from_secs(2), "/readyz to answer 503", || {
        get(admin, "/readyz", &[]).status == 503
    });
    // Halfway through the delay: well inside it on a loaded machine.
    std::thread::sleep((delay / 2).saturating_sub(stopped.elapsed()));
    assert_eq!(
        get(addr, "/demo", &[]).status,
        200,
        "served {:?} after SIGTERM",
        stopped.elapsed()
    );
    let limit = delay + grace + Duration::from_secs(1);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < limit,
            "still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "exit: {status}\n{}",
        std::fs::read_to_string(log.path()).unwrap()
    );
}

/// The running process is the pod's: its uid and gid, no capability in any
/// set, no way to gain one, and a read-only root.
fn assert_runs_confined(pid: u32, rendered: &Rendered) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default();
        line[name.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let pod = at(rendered.deployment(), "spec.template.spec.securityContext");
    let id = |key: &str| at(pod, key).as_u64().unwrap().to_string();
    assert!(
        field("Uid:").iter().all(|u| *u == id("runAsUser")),
        "{status}"
    );
    assert!(
        field("Gid:").iter().all(|g| *g == id("runAsGroup")),
        "{status}"
    );
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(set), ["0000000000000000"], "{set} in\n{status}");
    }
    assert_eq!(field("NoNewPrivs:"), ["1"], "{status}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap();
    let options = root.split(' ').nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the root is mounted {options}"
    );
}

/// Kills the pod's process if the test ends early.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Gone already when the test stopped it.
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}
