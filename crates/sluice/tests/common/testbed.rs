//! The integration tests' host: the library's testbed (`sluice_testkit::testbed`:
//! namespaces A, the sender, and B, the service and the gate, joined by a
//! veth pair; IPv4 only, so no IPv6 chatter disturbs exact counts), a folder
//! for sockets and files, and the processes a test starts. Dropping it kills
//! the processes, then removes the namespaces and the folder.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The bench's binary beside `sluice`: the victim service and the paced
/// sender (`sluice-bench serve udp-echo`, `sluice-bench send`), which the
/// daemon's binary does not ship. `cargo test --workspace` (`make test`)
/// builds it before any test runs.
pub fn load() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = Path::new(BIN).with_file_name("sluice-bench");
        assert!(
            p.exists(),
            "{} is missing: the tests run its serve and send; build it first (cargo build --release -p sluice-bench, \
             or run the tests with --workspace)",
            p.display()
        );
        p.to_str().unwrap().to_string()
    })
}

#[allow(unused_imports)]
pub use sluice::base::netns::in_netns;
#[allow(unused_imports)]
pub use sluice_testkit::testbed::netns_exists;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Testbed {
    pub a: String,
    pub b: String,
    /// Interface in B (where the gate goes) and in A.
    pub if_b: &'static str,
    pub if_a: &'static str,
    pub ip_a: String,
    pub ip_b: String,
    /// A's and B's MAC addresses, and the index of A's interface inside A.
    pub mac_a: [u8; 6],
    pub mac_b: [u8; 6],
    pub ifindex_a: u32,
    pub dir: PathBuf,
    children: Vec<Child>,
    // Last, so the namespaces go after the processes that live in them.
    net: sluice_testkit::testbed::Testbed,
}

impl Testbed {
    pub fn new() -> Testbed {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}-{n}", std::process::id());
        let opts = sluice_testkit::testbed::TestbedOpts { prefix: "sl-t", ipv6: false, queues: 1 };
        let net = sluice_testkit::testbed::Testbed::create(opts, &tag)
            .expect("making the test namespaces (tests run as root)");
        let dir = std::env::temp_dir().join(format!("sl-t{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        Testbed {
            a: net.a.clone(),
            b: net.b.clone(),
            if_b: sluice_testkit::testbed::IF_B,
            if_a: sluice_testkit::testbed::IF_A,
            ip_a: net.ip_a.to_string(),
            ip_b: net.ip_b.to_string(),
            mac_a: net.mac_a,
            mac_b: net.mac_b,
            ifindex_a: net.ifindex_a,
            dir,
            children: vec![],
            net,
        }
    }

    /// A command run inside namespace `ns`.
    pub fn cmd(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(args);
        c
    }

    /// `sluice ARGS` inside `ns`, waited for.
    pub fn sluice(&self, ns: &str, args: &[&str]) -> Output {
        self.cmd(ns, &[BIN]).args(args).output().unwrap()
    }

    /// Start `sluice ARGS` inside `ns` in the background; killed when the testbed drops.
    pub fn spawn(&mut self, ns: &str, args: &[&str]) -> u32 {
        self.spawn_bin(ns, BIN, args)
    }

    /// Start `sluice-bench ARGS` (`serve`, `send`: [`load`]) inside `ns`, as `spawn` does.
    pub fn spawn_load(&mut self, ns: &str, args: &[&str]) -> u32 {
        self.spawn_bin(ns, load(), args)
    }

    fn spawn_bin(&mut self, ns: &str, bin: &str, args: &[&str]) -> u32 {
        let child = self.cmd(ns, &[bin]).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// Start any command inside `ns` in the background (output discarded);
    /// killed when the testbed drops. `ip netns exec` execs it, so the pid is the command's.
    pub fn spawn_cmd(&mut self, ns: &str, args: &[&str]) -> u32 {
        let child = self.cmd(ns, args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// Is a spawned process still running?
    pub fn is_running(&mut self, pid: u32) -> bool {
        self.children.iter_mut().find(|c| c.id() == pid).is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Wait for a spawned process to exit; returns its output.
    pub fn wait(&mut self, pid: u32) -> Output {
        let i = self.children.iter().position(|c| c.id() == pid).expect("a spawned pid");
        self.children.remove(i).wait_with_output().unwrap()
    }

    pub fn signal(&self, pid: u32, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("sluice.sock")
    }

    /// Start `sluice run` on B's interface; returns once its socket answers.
    pub fn start_gate(&mut self, extra: &[&str]) -> u32 {
        let (b, sock, state) = (self.b.clone(), self.socket(), self.dir.join("state"));
        self.start_sluice(&b, self.if_b, &sock, &state, extra)
    }

    /// Start `sluice run` on `iface` inside `ns` with its own socket and
    /// state folder; returns once its socket answers.
    pub fn start_sluice(&mut self, ns: &str, iface: &str, sock: &Path, state: &Path, extra: &[&str]) -> u32 {
        let mut args = vec!["run", "--iface", iface, "--socket", sock.to_str().unwrap()];
        if !extra.contains(&"--metrics") {
            args.extend(["--metrics", "off"]);
        }
        args.extend(["--state-dir", state.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let pid = self.spawn(ns, &args);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sluice::surface::client::serving(sock) {
            if let Some(c) = self.children.iter_mut().find(|c| c.id() == pid) {
                if let Ok(Some(status)) = c.try_wait() {
                    let out = self.wait(pid);
                    panic!("sluice run exited early ({status}): {}", String::from_utf8_lossy(&out.stderr));
                }
            }
            assert!(Instant::now() < deadline, "sluice run did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        pid
    }

    /// The daemon's snapshot, via `sluice status --json`.
    pub fn status(&self) -> sluice::surface::stats::Snapshot {
        let out = self.sluice(&self.b, &["status", "--json", "--socket", self.socket().to_str().unwrap()]);
        assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Start a UDP sink on B's port; stops by itself after `secs`.
    pub fn start_sink(&mut self, port: u16, secs: f64) -> u32 {
        self.start_sink_with(port, secs, &[])
    }

    /// A UDP sink with more `serve udp-echo` flags (`--rcvbuf BYTES`, ...).
    pub fn start_sink_with(&mut self, port: u16, secs: f64, flags: &[&str]) -> u32 {
        let b = self.b.clone();
        let (port, secs) = (port.to_string(), secs.to_string());
        let mut args = vec!["serve", "udp-echo", "--port", &port, "--no-echo", "--json", "--duration", &secs];
        args.extend_from_slice(flags);
        let pid = self.spawn_load(&b, &args);
        std::thread::sleep(Duration::from_millis(300));
        pid
    }

    /// A UDP echo service on B's `port` for `secs` (its replies teach the learner).
    pub fn start_echo(&mut self, port: u16, secs: f64) -> u32 {
        let b = self.b.clone();
        let (port, secs) = (port.to_string(), secs.to_string());
        let pid = self.spawn_load(&b, &["serve", "udp-echo", "--port", &port, "--json", "--duration", &secs]);
        std::thread::sleep(Duration::from_millis(300));
        pid
    }

    /// Datagrams a sink received (waits for it to end).
    pub fn sink_received(&mut self, pid: u32) -> u64 {
        let out = self.wait(pid);
        assert!(out.status.success(), "sink failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["received"].as_u64().unwrap()
    }

    /// Send UDP from A to B's port at `rate` for `secs`; returns (sent, seconds).
    ///
    /// The sender is pinned to CPU 1. On veth the receive side (and so XDP)
    /// runs on the sender's CPU, so a sender the scheduler moves between CPUs
    /// moves the class's arrivals, which the daemon's per-CPU split follows
    /// one tick (10 ms) late, losing up to a tick of admissions per move.
    /// Pinned, it is like a NIC queue whose interrupts go to one CPU.
    pub fn send(&self, port: u16, rate: u64, secs: f64) -> (u64, f64) {
        let out = self.send_cmd(1, port, rate, secs).output().unwrap();
        assert!(out.status.success(), "send failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["sent"].as_u64().unwrap(), v["secs"].as_f64().unwrap())
    }

    /// `sluice-bench send --json` from A, pinned to `cpu`, to B's `port` at
    /// `rate` for `secs`, on a thread; join it for the sender's output.
    pub fn send_on_thread(&self, cpu: u32, port: u16, rate: u64, secs: f64) -> std::thread::JoinHandle<Output> {
        let mut c = self.send_cmd(cpu, port, rate, secs);
        std::thread::spawn(move || c.output().unwrap())
    }

    fn send_cmd(&self, cpu: u32, port: u16, rate: u64, secs: f64) -> Command {
        let (cpu, dst) = (cpu.to_string(), format!("{}:{port}", self.ip_b));
        let mut c = self.cmd(&self.a, &["taskset", "-c", &cpu, load()]);
        c.args(["send", "--dst", &dst, "--rate", &rate.to_string(), "--duration", &secs.to_string(), "--json"]);
        c
    }

    /// `send`, pinned to `cpu`, counting what comes back (an echo service's
    /// answers, until 300 ms after the last datagram): (sent, answered).
    pub fn send_answered(&self, cpu: u32, port: u16, rate: u64, secs: f64) -> (u64, u64) {
        let out = self.send_cmd(cpu, port, rate, secs).arg("--answers").output().unwrap();
        assert!(out.status.success(), "send failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["sent"].as_u64().unwrap(), v["answered"].as_u64().unwrap())
    }

    /// `send_on_thread` from `src`, a second address of A's (`add_host_a`).
    pub fn send_from_on_thread(
        &self,
        cpu: u32,
        src: &str,
        port: u16,
        rate: u64,
        secs: f64,
    ) -> std::thread::JoinHandle<Output> {
        let mut c = self.send_cmd(cpu, port, rate, secs);
        c.args(["--src", src]);
        std::thread::spawn(move || c.output().unwrap())
    }

    /// Give A's interface another address in its /24, the one whose last
    /// octet is `host`; returns it.
    pub fn add_host_a(&self, host: u8) -> String {
        let mut o = self.ip_a.parse::<std::net::Ipv4Addr>().expect("A's address is IPv4").octets();
        o[3] = host;
        let addr = std::net::Ipv4Addr::from(o).to_string();
        let out = self.cmd(&self.a, &["ip", "addr", "add", &format!("{addr}/24"), "dev", self.if_a]).output().unwrap();
        assert!(out.status.success(), "ip addr add: {}", String::from_utf8_lossy(&out.stderr));
        addr
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The XDP program id attached to B's interface (0 if none).
    pub fn attached_prog(&self) -> u64 {
        self.net.attached_prog().expect("ip link show").unwrap_or(0)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
