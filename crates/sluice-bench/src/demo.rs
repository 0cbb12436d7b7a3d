//! `sluice bench demo`: the daemon a user runs, in action. A UDP service in
//! namespace B (on CPU 1, the `nic` victim model) is flooded from A by a
//! socket sender on CPU 0, three times: without sluice, with `sluice run` at
//! a static limit, and with `sluice run` choosing the rate (`rate=auto`).
//! Midway through each gated flood it prints `sluice status`. Everything runs
//! as child processes of the real binary inside the one testbed; dropping the
//! testbed removes it all. Traffic stays inside the two namespaces.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::victim::{VictimBed, VictimModel, IF_B};

pub const PORT: u16 = 7000;
const GEN_CPU: usize = 0;
const VICTIM_CPU: usize = 1;

pub struct DemoOpts {
    /// The sluice binary (its `serve`, `send`, `run` and `status`).
    pub exe: PathBuf,
    /// Seconds of flood per phase.
    pub secs: f64,
    /// The service's CPU cost per datagram.
    pub work_ns: u64,
    /// The static phase's limit, packets/s.
    pub limit: u64,
}

/// Delivered datagrams/s of each phase.
#[derive(Debug, Clone, Copy)]
pub struct DemoResult {
    pub off: f64,
    pub static_limit: f64,
    pub auto: f64,
}

/// Run the three phases; prints as it goes.
pub fn run(o: &DemoOpts) -> Result<DemoResult> {
    sluice::gate::check_privileges()?;
    let bed = VictimBed::create("demo", VictimModel::Nic, GEN_CPU, VICTIM_CPU)?;
    // The nic model's receive side: the IP/UDP stack on the victim CPU (RPS),
    // beside the service. (No XDP is attached yet, so threaded NAPI stays off.)
    bed.net.write_in_b(&format!("/sys/class/net/{IF_B}/queues/rx-0/rps_cpus"), &format!("{:x}", 1u64 << VICTIM_CPU))?;
    let dir = std::env::temp_dir().join(format!("{}-files", bed.net.b));
    std::fs::create_dir_all(&dir)?;
    let demo = Demo { o, bed: &bed, dir: &dir };
    println!(
        "== testbed: namespaces {} (sender, CPU {GEN_CPU}) and {} (service, CPU {VICTIM_CPU}), veth va <-> vb",
        bed.net.a, bed.net.b
    );
    println!(
        "== the service spends {} ns per datagram on CPU {VICTIM_CPU}; the flood is as fast as one socket sender goes",
        o.work_ns
    );
    let result = (|| -> Result<DemoResult> {
        let off = demo.phase("without sluice", None)?;
        let static_limit = demo.phase(
            &format!("with sluice (static {})", sluice::stats::human(o.limit as f64)),
            Some(&format!("svc:rate={},match=udp:{PORT}", o.limit)),
        )?;
        let auto = demo.phase("with sluice (rate=auto)", Some(&format!("svc:rate=auto,match=udp:{PORT}")))?;
        Ok(DemoResult { off, static_limit, auto })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let r = result?;
    println!(
        "\n== delivered: {:.1}k pkt/s without sluice, {:.1}k pkt/s with sluice static ({:.2}x), {:.1}k pkt/s with rate=auto ({:.2}x)",
        r.off / 1e3,
        r.static_limit / 1e3,
        r.static_limit / r.off.max(1.0),
        r.auto / 1e3,
        r.auto / r.off.max(1.0)
    );
    Ok(r)
}

struct Demo<'a> {
    o: &'a DemoOpts,
    bed: &'a VictimBed,
    dir: &'a Path,
}

/// A child process, killed (if still running) when dropped.
struct Proc(Option<Child>);

impl Proc {
    fn spawn(mut c: Command, what: &str) -> Result<Proc> {
        Ok(Proc(Some(c.spawn().with_context(|| format!("starting {what}"))?)))
    }

    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.0.as_mut().map(Child::try_wait).transpose()?.flatten())
    }

    /// Wait for the process and take its output.
    fn into_output(mut self) -> Result<std::process::Output> {
        Ok(self.0.take().context("a process waited for twice")?.wait_with_output()?)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Demo<'_> {
    /// `sluice ARGS` in namespace `ns` on `cpu`, stdout piped.
    fn sluice(&self, ns: &str, cpu: Option<usize>, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        if let Some(cpu) = cpu {
            c.args(["taskset", "-c", &cpu.to_string()]);
        }
        c.arg(&self.o.exe).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// One flood; `class` starts `sluice run` with that --class once the
    /// service listens (rate=auto finds the service by its socket).
    /// Returns the datagrams/s the service took.
    fn phase(&self, label: &str, class: Option<&str>) -> Result<f64> {
        let b = &self.bed.net.b;
        let secs = self.o.secs;
        let serve_secs = format!("{}", secs + 3.0);
        let work = self.o.work_ns.to_string();
        let port = PORT.to_string();
        let serve_args = [
            "serve",
            "udp-echo",
            "--port",
            &port,
            "--work-ns",
            &work,
            "--no-echo",
            "--duration",
            &serve_secs,
            "--json",
        ];
        let serve = Proc::spawn(self.sluice(b, Some(VICTIM_CPU), &serve_args), "the service")?;
        std::thread::sleep(Duration::from_millis(500));
        let sock = self.dir.join(format!("{}.sock", label.len()));
        let gate = match class {
            Some(c) => {
                println!("== sluice run --iface {IF_B} --class '{c}'");
                Some(self.start_gate(c, &sock)?)
            }
            None => None,
        };
        let dst = format!("{}:{PORT}", self.bed.net.ip_b);
        let send_args =
            ["send", "--dst", &dst, "--rate", "0", "--duration", &secs.to_string(), "--flows", "16", "--json"];
        let send = Proc::spawn(self.sluice(&self.bed.net.a, Some(GEN_CPU), &send_args), "the sender")?;
        if gate.is_some() {
            std::thread::sleep(Duration::from_secs_f64(secs / 2.0 + 0.5));
            println!("== sluice status, during the flood");
            let st = self.sluice(b, None, &["status", "--socket", sock.to_str().unwrap_or_default()]).output()?;
            print!("{}", String::from_utf8_lossy(&st.stdout));
        }
        let sent = json_of(send.into_output()?, "the sender")?;
        let served = json_of(serve.into_output()?, "the service")?;
        if let Some(g) = gate {
            stop_gate(g)?;
        }
        let secs = sent["secs"].as_f64().context("the sender's seconds")?;
        let offered = sent["sent"].as_f64().context("the sender's count")? / secs;
        let delivered = served["received"].as_f64().context("the service's count")? / secs;
        println!("{label:<34} offered {:8.1}k pkt/s   service delivered {:8.1}k pkt/s", offered / 1e3, delivered / 1e3);
        Ok(delivered)
    }

    /// `sluice run` on vb; returns once its statistics socket answers.
    fn start_gate(&self, class: &str, sock: &Path) -> Result<Proc> {
        let args = [
            "run",
            "--iface",
            IF_B,
            "--class",
            class,
            "--socket",
            sock.to_str().unwrap_or_default(),
            "--metrics",
            "off",
        ];
        let mut gate = Proc::spawn(self.sluice(&self.bed.net.b, None, &args), "sluice run")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            if let Some(status) = gate.try_wait()? {
                let out = gate.into_output()?;
                bail!("sluice run exited ({status}): {}", String::from_utf8_lossy(&out.stderr));
            }
            if Instant::now() > deadline {
                bail!("sluice run did not open {} within 10 s", sock.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(gate)
    }
}

/// SIGTERM (the daemon detaches and prints its totals), then wait.
fn stop_gate(g: Proc) -> Result<()> {
    // SAFETY: kill(2) on our own child's pid.
    if unsafe { libc::kill(g.id() as i32, libc::SIGTERM) } != 0 {
        bail!("stopping sluice run: {}", std::io::Error::last_os_error());
    }
    let out = g.into_output()?;
    if !out.status.success() {
        bail!("sluice run failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn json_of(out: std::process::Output, what: &str) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{what}'s JSON report"))
}
