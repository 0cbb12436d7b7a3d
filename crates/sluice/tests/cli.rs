//! The command line refuses bad values before anything runs, naming the flag
//! (no root needed: none of these gets as far as the kernel).
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn sluice(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("running sluice")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Regression: `status --watch 0` fetched a snapshot first and complained
/// about the interval only afterwards (or about the missing daemon instead).
#[test]
fn a_bad_watch_interval_is_refused_before_the_daemon_is_asked() {
    for bad in ["0", "-1", "nan", "soon"] {
        let o = sluice(&["status", &format!("--watch={bad}"), "--socket", "/nonexistent/sluice.sock"]);
        assert!(!o.status.success(), "--watch {bad}");
        let e = stderr(&o);
        assert!(e.contains("--watch") && !e.contains("cannot reach"), "--watch {bad}: {e}");
    }
}

/// The victim service and the paced sender are the bench's (`sluice bench
/// serve`, `sluice bench send`): the daemon's binary ships no test tool.
#[test]
fn the_daemon_binary_has_no_test_tools() {
    for tool in ["serve", "send"] {
        let o = sluice(&[tool, "--help"]);
        assert!(!o.status.success() && stderr(&o).contains("unrecognized subcommand"), "{tool}: {}", stderr(&o));
        let o = sluice(&["bench", tool, "--help"]);
        assert!(o.status.success(), "bench {tool}: {}", stderr(&o));
    }
}

/// `status --schema` needs no daemon and describes every field it prints
/// (the schema docs/status-json.md is made from).
#[test]
fn the_status_schema_describes_its_fields() {
    let o = sluice(&["status", "--schema"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let props = v["properties"].as_object().expect("an object schema");
    assert!(props.contains_key("classes") && props.contains_key("version"), "{props:?}");
    assert!(props["version"]["description"].is_string(), "{:?}", props["version"]);
    let o = sluice(&["status", "--schema", "--json"]);
    assert!(!o.status.success() && stderr(&o).contains("--json"), "{}", stderr(&o));
}

#[test]
fn durations_are_checked_the_same_way_everywhere() {
    for args in [
        &["bench", "send", "--dst", "127.0.0.1:9", "--rate", "1", "--duration", "0"][..],
        &["bench", "serve", "udp-echo", "--port", "9", "--duration=-2"],
        &["bench", "run", "--duration", "inf"],
        &["bench", "generator", "--duration", "0"],
    ] {
        let o = sluice(args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains("--duration") && e.contains("positive number of seconds"), "{args:?}: {e}");
    }
}

#[test]
fn bad_values_name_their_flag() {
    let cases: [(&[&str], &str); 6] = [
        (&["run", "--iface", "x", "--metrics", "nowhere"], "is not ADDR:PORT or \"off\""),
        (&["run", "--iface", "x", "--xdp-mode", "fast"], "valid modes are native and generic"),
        (&["bench", "step", "--phase", "100"], "a phase is 0.5 to 60 seconds"),
        (&["bench", "step", "--models", "gpu"], "--models"),
        (&["bench", "gate", "--rounds", "0"], "--rounds"),
        (
            &["bench", "run", "--scenario", "dns", "--clients-cpu", "4096"],
            "--clients-cpu 4096: this host runs CPUs 0 to",
        ),
    ];
    for (args, said) in cases {
        let o = sluice(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(said), "{args:?}: {}", stderr(&o));
    }
}
