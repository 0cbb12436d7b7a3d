//! The Debian package as `make deb` makes it (from the release build this
//! test run uses): what it holds, that dpkg installs it (into a root of the
//! test's own, with dpkg's database there, so the machine is not touched),
//! that its systemd unit verifies clean, that its man pages and completions
//! work, and that the unit's ExecStart, run with exactly the unit's
//! capabilities, protects a service in a test namespace and reloads on the
//! unit's ExecReload. This machine has no systemd as PID 1, so the unit is
//! not started by systemd here; its command line is.
mod common;

use sluice::signals::discover::USERS_CLASS;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::testbed::Testbed;

const TOP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn ok(what: &str, o: Output) -> String {
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what} failed ({}): {out}", o.status);
    out
}

/// A package built by `make package-deb` and installed into `root` by dpkg.
struct Package {
    dir: tempfile::TempDir,
    deb: PathBuf,
    root: PathBuf,
}

impl Package {
    fn build() -> Package {
        let dir = tempfile::Builder::new().prefix("sl-pkg").tempdir().unwrap();
        // The service the ExecStart test runs as `nobody` execs the installed binary.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let debdir = dir.path().join("build");
        let mut make = Command::new("make");
        make.args(["-s", "-C", TOP, "package-deb"]).arg(format!("DEBDIR={}", debdir.display()));
        ok("make package-deb", make.output().unwrap());
        let deb = std::fs::read_dir(&debdir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .expect("make package-deb wrote a .deb");
        let root = dir.path().join("root");
        let admin = root.join("var/lib/dpkg");
        std::fs::create_dir_all(admin.join("info")).unwrap();
        std::fs::create_dir_all(admin.join("updates")).unwrap();
        std::fs::write(admin.join("status"), "").unwrap();
        // --force-depends: the test root has no libc6 etc. installed in dpkg's view.
        let install = Command::new("dpkg")
            .arg(format!("--instdir={}", root.display()))
            .arg(format!("--admindir={}", admin.display()))
            .args(["--force-script-chrootless", "--force-not-root", "--force-depends", "-i"])
            .arg(&deb)
            .output()
            .unwrap();
        ok("dpkg -i", install);
        Package { dir, deb, root }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The installed unit, its [Service] keys (a key given twice keeps the last).
    fn unit(&self) -> (String, BTreeMap<String, String>) {
        let text = std::fs::read_to_string(self.path("/lib/systemd/system/sluice@.service")).unwrap();
        let keys = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        (text, keys)
    }
}

#[test]
fn the_package_holds_the_daemon_its_unit_man_pages_and_completions() {
    let pkg = Package::build();
    let info = ok("dpkg-deb -I", Command::new("dpkg-deb").arg("-I").arg(&pkg.deb).output().unwrap());
    for field in ["Package: sluice", "Depends: ", "libelf1", "zlib1g", "Description: "] {
        assert!(info.contains(field), "control lacks {field}: {info}");
    }
    let conffiles = std::fs::read_to_string(pkg.root.join("var/lib/dpkg/info/sluice.conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/default/sluice", "an admin's SLUICE_ARGS survive upgrades");
    for f in [
        "/usr/bin/sluice",
        "/usr/bin/sluice-bench",
        "/lib/systemd/system/sluice@.service",
        "/etc/default/sluice",
        "/usr/share/bash-completion/completions/sluice",
        "/usr/share/zsh/vendor-completions/_sluice",
        "/usr/share/fish/vendor_completions.d/sluice.fish",
        "/usr/share/doc/sluice/copyright",
        "/usr/share/doc/sluice/sluice.example.toml",
    ] {
        assert!(pkg.path(f).exists(), "{f} is not in the package");
    }
    // The example the README points at is a config the packaged binary takes.
    let example = pkg.path("/usr/share/doc/sluice/sluice.example.toml");
    let checked = Command::new(pkg.path("/usr/bin/sluice")).arg("check-config").arg(&example).output().unwrap();
    ok("sluice check-config on the example", checked);
    assert!(pkg.path("/etc/sluice").is_dir(), "the per-interface config directory");
    // The binary is the one this test run built, stripped.
    let v = ok("sluice --version", Command::new(pkg.path("/usr/bin/sluice")).arg("--version").output().unwrap());
    assert!(v.starts_with("sluice "), "{v}");
}

#[test]
fn every_command_has_a_man_page_that_renders() {
    let pkg = Package::build();
    let help = ok("sluice help", Command::new(pkg.path("/usr/bin/sluice")).arg("help").output().unwrap());
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 7 && commands.contains(&"run"), "commands in `sluice help`: {commands:?}");
    let man1 = pkg.path("/usr/share/man/man1");
    for c in std::iter::once("sluice".to_string()).chain(commands.iter().map(|c| format!("sluice-{c}"))) {
        let page = man1.join(format!("{c}.1.gz"));
        assert!(page.exists(), "no man page {}", page.display());
        let Ok(o) = Command::new("man").arg("-l").arg(&page).env("MANWIDTH", "100").output() else {
            eprintln!("man is not installed: pages checked for presence only");
            continue;
        };
        let text = ok("man -l", o);
        assert!(text.contains("NAME") && text.contains(&c), "{c}.1 renders without its name: {text}");
    }
    let run =
        String::from_utf8(Command::new("man").arg("-l").arg(man1.join("sluice-run.1.gz")).output().unwrap().stdout)
            .unwrap();
    assert!(
        run.contains("--iface") && run.contains("/etc/sluice/IFACE.toml"),
        "sluice-run(1) documents the flags: {run}"
    );
}

#[test]
fn bash_completion_completes_commands_and_flags() {
    let pkg = Package::build();
    let file = pkg.path("/usr/share/bash-completion/completions/sluice");
    // What bash does on TAB: set COMP_* and call the function `complete -F` named.
    let complete = |words: &[&str]| -> Vec<String> {
        let script = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
             _sluice sluice '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display(),
            words.join(" "),
            words.len() - 1,
            words[words.len() - 1],
            words[words.len() - 2]
        );
        ok("bash completion", Command::new("bash").args(["-c", &script]).output().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(complete(&["sluice", "ru"]), ["run"]);
    assert!(complete(&["sluice", "st"]).contains(&"status".to_string()));
    assert_eq!(complete(&["sluice", "run", "--if"]), ["--iface"]);
    assert!(complete(&["sluice", "trace", "--sam"]).contains(&"--samples-per-sec".to_string()));
    for (shell, file) in [
        ("zsh", "/usr/share/zsh/vendor-completions/_sluice"),
        ("fish", "/usr/share/fish/vendor_completions.d/sluice.fish"),
    ] {
        let text = std::fs::read_to_string(pkg.path(file)).unwrap();
        assert!(text.contains("samples-per-sec") && text.contains("check-config"), "{shell} completions: {text}");
        match Command::new(shell).arg("-n").arg(pkg.path(file)).output() {
            Ok(o) => drop(ok(&format!("{shell} -n"), o)),
            Err(_) => eprintln!("{shell} is not installed: its completions' syntax is not checked"),
        }
    }
}

#[test]
fn the_unit_verifies_clean_and_is_hardened() {
    let pkg = Package::build();
    let (text, keys) = pkg.unit();
    assert_eq!(keys["ExecStart"], "/usr/bin/sluice run --iface %I $SLUICE_ARGS");
    assert_eq!(keys["ExecReload"], "/bin/kill -HUP $MAINPID", "systemctl reload = SIGHUP");
    assert_eq!(keys["EnvironmentFile"], "-/etc/default/sluice");
    for (k, v) in [
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectHome", "yes"),
        ("RuntimeDirectory", "sluice"),
        ("RuntimeDirectoryPreserve", "yes"),
        ("StateDirectory", "sluice"),
        // Issue 49, item 4: ready once attached, a watchdog on the tick loop.
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "10s"),
    ] {
        assert_eq!(keys.get(k).map(String::as_str), Some(v), "{k}");
    }
    let caps = &keys["CapabilityBoundingSet"];
    assert!(!caps.contains("CAP_SYS_ADMIN") && caps.contains("CAP_BPF"), "{caps}");
    // The daemon's defaults are where the unit lets it write.
    assert_eq!(sluice::surface::client::SOCKET_DIR, "/run/sluice");
    assert_eq!(sluice::signals::known::STATE_DIR, "/var/lib/sluice");
    assert_eq!(sluice::daemon::CONFIG_DIR, "/etc/sluice");

    let v = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze: {e} (install it with `make deps`: Debian package systemd)"));
    assert!(v.status.success());
    // verify checks that ExecStart's binary exists and that `man sluice-run`
    // works: point both at the package's copies.
    let unit = pkg.dir.path().join("sluice@veth0.service");
    std::fs::write(&unit, text.replace("/usr/bin/sluice", pkg.path("/usr/bin/sluice").to_str().unwrap())).unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify"])
        .arg(&unit)
        .env("MANPATH", pkg.path("/usr/share/man"))
        .output()
        .unwrap();
    let said = ok("systemd-analyze verify", o);
    assert!(said.trim().is_empty(), "systemd-analyze verify is not clean: {said}");
}

/// The installed unit's ExecStart, as systemd would run it for sluice@IFACE
/// with SLUICE_ARGS from /etc/default/sluice, under the unit's capability
/// bounding set and no_new_privs (setpriv), in the testbed's namespace B.
/// A service run by another user (nobody) with two reader sockets must be
/// discovered by its process name, get reader steering, and the drop counter
/// must count drops after the gate: each needs one of the unit's capabilities.
/// A service run by nobody with two reader sockets on B's port 5353, and
/// the installed unit's ExecStart started in B under the unit's capability
/// bounding set less `without` (e.g. "CAP_DAC_READ_SEARCH"), no_new_privs
/// and no inheritable capabilities: the daemon, its pid and its socket.
fn start_exec_start(
    pkg: &Package,
    keys: &std::collections::BTreeMap<String, String>,
    tb: &mut Testbed,
    without: Option<&str>,
) -> (Guard, u32, std::path::PathBuf) {
    let bin = pkg.path("/usr/bin/sluice");
    let bin = bin.to_str().unwrap();
    let load = pkg.path("/usr/bin/sluice-bench");
    let b = tb.b.clone();
    tb.spawn_cmd(
        &b,
        &["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", load.to_str().unwrap()]
            .into_iter()
            .chain(["serve", "udp-echo", "--port", "5353", "--readers", "2", "--duration", "30"])
            .collect::<Vec<_>>(),
    );
    let bounding = keys["CapabilityBoundingSet"]
        .split_whitespace()
        .filter(|c| Some(*c) != without)
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let sock = tb.socket();
    let state = tb.dir.join("state");
    let sluice_args = format!("--socket {} --metrics off --state-dir {}", sock.display(), state.display());
    let exec_start =
        keys["ExecStart"].replace("/usr/bin/sluice", bin).replace("%I", tb.if_b).replace("$SLUICE_ARGS", &sluice_args);
    let mut argv = vec!["setpriv".to_string(), format!("--bounding-set=-all,{bounding}"), "--no-new-privs".into()];
    argv.extend(["--inh-caps=-all".into()]);
    argv.extend(exec_start.split_whitespace().map(str::to_string));
    let child = tb
        .cmd(&b, &argv.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (Guard(Some(child)), pid, sock)
}

/// Issue 23, item 14: the test below says each of its checks needs one of
/// the unit's capabilities; this one drops CAP_DAC_READ_SEARCH and sees the
/// service's owner go unnamed (its /proc/PID/fd, mode 0500 and nobody's,
/// cannot be listed), so that check can fail.
#[test]
fn without_cap_dac_read_search_the_service_is_not_named_after_its_process() {
    let pkg = Package::build();
    let (_, keys) = pkg.unit();
    let mut tb = Testbed::new();
    let (mut guard, _, sock) = start_exec_start(&pkg, &keys, &mut tb, Some("CAP_DAC_READ_SEARCH"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let class = loop {
        if sluice::surface::client::serving(&sock) {
            if let Some(c) = tb.status().classes.into_iter().find(|c| c.name == USERS_CLASS) {
                break c;
            }
        }
        let child = guard.0.as_mut().unwrap();
        if let Ok(Some(st)) = child.try_wait() {
            panic!("ExecStart exited ({st}): {}", stderr_of(child));
        }
        assert!(Instant::now() < deadline, "the service was not found at all");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Run by nobody, its port is in the users' class whoever holds it; the reason says who.
    let why = class.discovered.unwrap_or_default();
    assert!(why.contains("no process visible"), "no owner visible without CAP_DAC_READ_SEARCH: {why}");
}

#[test]
fn exec_start_with_only_the_units_capabilities_protects_and_reloads() {
    let pkg = Package::build();
    let (_, keys) = pkg.unit();
    let mut tb = Testbed::new();
    let (mut guard, pid, sock) = start_exec_start(&pkg, &keys, &mut tb, None);
    let child = guard.0.as_mut().unwrap();

    // Up, and the service found, named and steered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let snap = loop {
        if sluice::surface::client::serving(&sock) {
            let s = tb.status();
            if s.classes.iter().any(|c| c.name == USERS_CLASS) && !s.readers.is_empty() {
                break s;
            }
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("ExecStart exited ({st}): {}", stderr_of(child));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ExecStart did not come up with a steered service: {}", stderr_of(child));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(tb.attached_prog(), 0, "the gate is attached");
    let class = snap.classes.iter().find(|c| c.name == USERS_CLASS).unwrap();
    // Run by nobody: the users' class, at the default class's priority, not
    // its nice's (the trust model); its reason names the process (needs
    // CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH) and its user.
    assert_eq!(class.priority, sluice::signals::discover::UNTRUSTED_PRIORITY, "{:?}", class.discovered);
    let why = class.discovered.as_deref().unwrap_or_default();
    assert!(why.contains("sluice-bench pid") && why.contains("uid 65534"), "{why}");
    assert_eq!(snap.readers[0].readers.len(), 2, "reader steering (pidfd_getfd)");
    assert_eq!(snap.config_file, None, "no /etc/sluice/{}.toml: zero-config", tb.if_b);

    // Drops after the gate are counted (the tracer needs no CAP_SYS_ADMIN).
    tb.send(7999, 2000, 0.5);
    let deadline = Instant::now() + Duration::from_secs(5);
    while tb.status().classes.iter().all(|c| c.kernel_drops.is_empty()) {
        assert!(Instant::now() < deadline, "no drop after the gate counted for a closed port");
        std::thread::sleep(Duration::from_millis(100));
    }

    // systemctl reload: the unit's ExecReload with $MAINPID.
    let reload = keys["ExecReload"].replace("$MAINPID", &pid.to_string());
    let mut words = reload.split_whitespace();
    ok("ExecReload", Command::new(words.next().unwrap()).args(words).output().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while tb.status().reloads != 1 {
        assert!(Instant::now() < deadline, "ExecReload did not reload");
        std::thread::sleep(Duration::from_millis(100));
    }

    // systemctl stop: SIGTERM, a clean exit, the gate detached.
    tb.signal(pid, libc::SIGTERM);
    let out = guard.0.take().unwrap().wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "stop: {log}");
    assert_eq!(tb.attached_prog(), 0, "detached on stop");
    assert!(log.contains(&format!("config file: none (/etc/sluice/{}.toml does not exist)", tb.if_b)), "{log}");
    assert!(log.contains("SCHED_FIFO priority 1"), "CAP_SYS_NICE: {log}");
    assert!(!log.to_lowercase().contains("permission"), "something was refused: {log}");
}

/// The daemon, killed if the test fails before stopping it.
struct Guard(Option<std::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What an exited (or killed) child wrote to stderr.
fn stderr_of(c: &mut std::process::Child) -> String {
    use std::io::Read;
    let _ = c.wait();
    let mut s = String::new();
    if let Some(e) = c.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}
