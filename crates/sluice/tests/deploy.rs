//! The files in deploy/ for running sluice among other tools: the alert
//! rules pass `promtool check rules` and their own `promtool test rules`
//! cases, every dashboard query is valid PromQL, and the Kubernetes
//! DaemonSet agrees with the systemd unit and the daemon (the same
//! capabilities, the daemon's paths and port, a config the daemon accepts).
//! That the metrics they name are served is checked against a running
//! daemon in tests/integration.rs (`metrics_are_served`).
mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const TOP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Run promtool (`make deps` installs it: Debian's prometheus) and return what it said.
fn promtool(args: &[&str], dir: &Path) -> String {
    let o = Command::new("promtool").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("promtool {}: {e} (install it with `make deps`: Debian package prometheus)", args.join(" "))
    });
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "promtool {}: {said}", args.join(" "));
    said
}

#[test]
fn alert_rules_are_valid_and_fire_when_they_should() {
    let dir = Path::new(TOP).join("deploy/prometheus");
    let said = promtool(&["check", "rules", "sluice-alerts.yml"], &dir);
    assert!(said.contains("SUCCESS: 5 rules found"), "{said}");
    promtool(&["test", "rules", "sluice-alerts.test.yml"], &dir);
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let text = std::fs::read_to_string(Path::new(TOP).join("deploy/grafana/sluice-dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(exprs.len() >= 15, "{exprs:?}");
    // Grafana's variables become what Grafana would put there; each query a recording rule.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$__rate_interval", "5m").replace("$instance", ".*");
        rules += &format!("      - record: dashboard:query{i}\n        expr: {}\n", serde_json::to_string(&e).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard-rules.yml"), rules).unwrap();
    let said = promtool(&["check", "rules", "dashboard-rules.yml"], dir.path());
    assert!(said.contains(&format!("SUCCESS: {} rules found", exprs.len())), "{said}");
}

/// deploy/kubernetes/sluice.yaml as JSON documents (python3's yaml module).
fn manifest() -> Vec<Value> {
    let path = Path::new(TOP).join("deploy/kubernetes/sluice.yaml");
    let script = "import sys, json, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    let o = Command::new("python3").args(["-c", script]).arg(&path).output().expect("python3");
    assert!(o.status.success(), "the manifest is not YAML: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_daemonset_agrees_with_the_unit_and_the_daemon() {
    let docs = manifest();
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k}"));
    let pod = &kind("DaemonSet")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["hostNetwork"], true, "the node's interface and services");
    assert_eq!(spec["hostPID"], true, "discovery names the processes holding the node's sockets");
    let c = &spec["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let mut added: Vec<String> =
        sc["capabilities"]["add"].as_array().unwrap().iter().map(|v| format!("CAP_{}", v.as_str().unwrap())).collect();
    added.sort();
    let unit = std::fs::read_to_string(Path::new(TOP).join("packaging/systemd/sluice@.service")).unwrap();
    let mut bounding: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    bounding.sort();
    assert_eq!(added, bounding, "the pod's capabilities are the unit's");

    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[0], "run");
    // Issue 49, item 11: the metrics (throttles, learning) were served on the
    // node's IP to every pod. The daemon serves the node's loopback only;
    // kube-rbac-proxy serves them on the node's IP to callers allowed /metrics.
    let metrics = args.iter().find_map(|a| a.strip_prefix("--metrics=")).expect("a metrics address");
    let addr: std::net::SocketAddr = metrics.parse().expect("a plain address, no variable");
    assert!(addr.ip().is_loopback(), "the daemon's metrics on loopback only: {metrics}");
    assert!(args.contains(&"--log-format=json"), "{args:?}");
    let proxy =
        spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "kube-rbac-proxy").expect("the proxy");
    let pargs: Vec<&str> = proxy["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(
        pargs.contains(&format!("--upstream=http://{addr}/").as_str()),
        "the proxy forwards to the daemon: {pargs:?}"
    );
    assert!(pargs.contains(&"--secure-listen-address=$(NODE_IP):9786"), "{pargs:?}");
    assert_eq!(proxy["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(proxy["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], "9786");
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/scheme"], "https");
    assert_eq!(spec["serviceAccountName"], "sluice");
    let reader = docs.iter().find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "sluice-metrics-reader");
    assert_eq!(reader.expect("a role for the scraper")["rules"][0]["nonResourceURLs"], serde_json::json!(["/metrics"]));
    let mounts: Vec<&str> =
        c["volumeMounts"].as_array().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
    for dir in [sluice::daemon::CONFIG_DIR, sluice::surface::client::SOCKET_DIR, sluice::signals::known::STATE_DIR] {
        assert!(mounts.contains(&dir), "{dir} is not mounted: {mounts:?}");
    }
    // The manifest's own args, as Kubernetes expands them, parsed by the
    // daemon (clap reads them in order: an unknown flag or a bad value fails
    // before the final --help prints).
    let expanded: Vec<String> =
        args.iter().map(|a| a.replace("$(SLUICE_IFACE)", "eth0").replace("$(NODE_IP)", "10.0.0.1")).collect();
    assert!(expanded.iter().all(|a| !a.contains("$(")), "a variable the test does not expand: {expanded:?}");
    let o = Command::new(common::testbed::BIN).args(&expanded).arg("--help").output().unwrap();
    assert!(o.status.success(), "{expanded:?}: {}", String::from_utf8_lossy(&o.stderr));
    let bad = Command::new(common::testbed::BIN).args(&expanded).args(["--no-such-flag", "--help"]).output().unwrap();
    assert!(!bad.status.success(), "the check can fail: an unknown flag before --help is refused");
}

#[test]
fn the_configmap_holds_configs_the_daemon_accepts() {
    let docs = manifest();
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = cm["data"].as_object().unwrap();
    assert!(!data.is_empty());
    for (key, text) in data {
        assert!(key.ends_with(".toml"), "{key}: the daemon reads /etc/sluice/IFACE.toml");
        let path = dir.path().join(key);
        std::fs::write(&path, text.as_str().unwrap()).unwrap();
        let o = Command::new(common::testbed::BIN).arg("check-config").arg(&path).output().unwrap();
        assert!(o.status.success(), "{key}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
