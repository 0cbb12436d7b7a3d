//! The bench's threads inside namespace A: the generator, pinned to the
//! generator CPU, and the socket that receives the echoed legitimate requests.
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::load::gen::{mono_ns, Generator, StreamCount};
use sluice::base::netns;

/// What a generator run returns: the per-stream counts and the seconds it sent for.
pub(crate) type GenDone = Result<(Vec<StreamCount>, f64)>;

/// One legitimate reply: when its request was sent and when the reply came back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    pub sent_ns: u64,
    pub recv_ns: u64,
}

/// The socket in A that receives the echoed legitimate requests.
pub(crate) struct ReplyRx {
    replies: Arc<Mutex<Vec<Reply>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A thread in namespace `ns` receiving on a UDP socket bound to `bind`,
/// handing each datagram to `each`, until `stop` is set; returns once bound.
pub(crate) fn receive_in(
    ns: &str,
    bind: SocketAddr,
    stop: Arc<AtomicBool>,
    mut each: impl FnMut(&[u8]) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let ns = ns.to_string();
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let sock = (|| -> Result<UdpSocket> {
            netns::enter(&ns)?;
            let sock = UdpSocket::bind(bind)?;
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(sock)
        })();
        let sock = match sock {
            Ok(s) => {
                let _ = tx.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = sock.recv(&mut buf) {
                each(&buf[..n]);
            }
        }
    });
    rx.recv().context("receiver thread")??;
    Ok(thread)
}

impl ReplyRx {
    pub fn start(ns: &str, bind: SocketAddr) -> Result<ReplyRx> {
        let replies = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let r = replies.clone();
        let thread = receive_in(ns, bind, stop.clone(), move |d| {
            if d.len() >= 16 {
                let sent_ns = u64::from_ne_bytes(d[0..8].try_into().unwrap());
                r.lock().unwrap().push(Reply { sent_ns, recv_ns: mono_ns() });
            }
        })
        .context("reply receiver")?;
        Ok(ReplyRx { replies, stop, thread: Some(thread) })
    }

    pub fn take(&self) -> Vec<Reply> {
        std::mem::take(&mut *self.replies.lock().unwrap())
    }
}

impl Drop for ReplyRx {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The generator, on a thread that lives in A, pinned to the generator CPU.
pub(crate) struct GenWorker {
    pub gen: Arc<RwLock<Generator>>,
    jobs: mpsc::Sender<(Duration, u32, mpsc::Sender<GenDone>)>,
}

impl GenWorker {
    /// The generator thread in `ns`, pinned to `cpu`, at `nice` (19: it takes
    /// only the CPU time the other tasks there leave, as a flood that must not
    /// starve the legitimate clients sharing its CPU).
    pub fn start(ns: &str, cpu: usize, ifindex: u32, nice: i32) -> Result<GenWorker> {
        let gen = Arc::new(RwLock::new(Generator::load()?));
        let (jobs, rx) = mpsc::channel::<(Duration, u32, mpsc::Sender<GenDone>)>();
        let (g, ns) = (gen.clone(), ns.to_string());
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let setup = netns::enter(&ns).and_then(|_| netns::pin_thread(cpu)).and_then(|_| set_thread_nice(nice));
            let ok = setup.is_ok();
            let _ = ready_tx.send(setup);
            if !ok {
                return;
            }
            for (d, batch, reply) in rx {
                let _ = reply.send(g.read().unwrap().run(ifindex, d, batch));
            }
        });
        ready_rx.recv().context("generator thread")??;
        Ok(GenWorker { gen, jobs })
    }

    pub fn send_for(&self, d: Duration, batch: u32) -> mpsc::Receiver<GenDone> {
        let (tx, rx) = mpsc::channel();
        let _ = self.jobs.send((d, batch, tx));
        rx
    }
}

/// Set the calling thread's nice value (Linux: a thread is a task of its own for setpriority).
pub(crate) fn set_thread_nice(nice: i32) -> Result<()> {
    // SAFETY: setpriority on our own thread id.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    anyhow::ensure!(r == 0, "setting a thread's nice to {nice}: {}", std::io::Error::last_os_error());
    Ok(())
}
