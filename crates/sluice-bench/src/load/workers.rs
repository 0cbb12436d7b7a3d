//! The bench's threads inside namespace A: the generator, pinned to the
//! generator CPU, and the socket that receives the echoed legitimate requests.
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::gen_intf::sluice_gen_stream;
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

/// The generator: a thread per CPU it was given, each in A, pinned there,
/// with a generator program of its own (each paces its own streams). Every
/// stream's rate is split evenly among them, so a flood enters on as many
/// queues as there are workers.
pub(crate) struct GenWorker {
    workers: Vec<Worker>,
}

struct Worker {
    gen: Arc<RwLock<Generator>>,
    jobs: mpsc::Sender<(Duration, u32, mpsc::Sender<GenDone>)>,
}

impl GenWorker {
    /// A generator thread on each of `cpus` in `ns`, at `nice` (19: it takes
    /// only the CPU time the other tasks there leave, as a flood that must
    /// not starve the legitimate clients sharing its CPU).
    pub fn start(ns: &str, cpus: &[usize], ifindex: u32, nice: i32) -> Result<GenWorker> {
        anyhow::ensure!(!cpus.is_empty(), "the generator needs at least one CPU");
        let workers = cpus.iter().map(|&cpu| Worker::start(ns, cpu, ifindex, nice)).collect::<Result<_>>()?;
        Ok(GenWorker { workers })
    }

    /// Set the streams (the template and each stream's whole rate): each
    /// worker sends every stream at its share of the rate.
    pub fn set_streams(&self, streams: &[sluice_gen_stream]) -> Result<()> {
        let n = self.workers.len() as u64;
        let share: Vec<sluice_gen_stream> =
            streams.iter().map(|s| sluice_gen_stream { interval_fp: s.interval_fp * n, ..*s }).collect();
        self.workers.iter().try_for_each(|w| w.gen.write().unwrap().set_streams(&share))
    }

    /// Change stream `i`'s whole rate during a run (0 pauses it).
    pub fn set_rate_live(&self, i: usize, rate: f64) -> Result<()> {
        let share = rate / self.workers.len() as f64;
        self.workers.iter().try_for_each(|w| w.gen.read().unwrap().set_rate_live(i, share))
    }

    /// Per-stream counts so far, of every worker together.
    pub fn counts(&self) -> Result<Vec<StreamCount>> {
        let each = self.workers.iter().map(|w| w.gen.read().unwrap().counts()).collect::<Result<Vec<_>>>()?;
        Ok(sum_counts(each.iter().map(Vec::as_slice)))
    }

    /// Send for `d` from every worker; the answer is their counts summed,
    /// and the seconds that make the summed count over them the sum of the
    /// workers' own rates.
    pub fn send_for(&self, d: Duration, batch: u32) -> mpsc::Receiver<GenDone> {
        let started: Vec<_> = self.workers.iter().map(|w| w.send_for(d, batch)).collect();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let done: GenDone = (|| {
                let each = started
                    .into_iter()
                    .map(|r| r.recv().context("a generator worker stopped")?)
                    .collect::<Result<Vec<_>>>()?;
                Ok(join_runs(&each))
            })();
            let _ = tx.send(done);
        });
        rx
    }
}

impl Worker {
    fn start(ns: &str, cpu: usize, ifindex: u32, nice: i32) -> Result<Worker> {
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
        ready_rx.recv().context("generator thread")?.with_context(|| format!("the generator worker on CPU {cpu}"))?;
        Ok(Worker { gen, jobs })
    }

    fn send_for(&self, d: Duration, batch: u32) -> mpsc::Receiver<GenDone> {
        let (tx, rx) = mpsc::channel();
        let _ = self.jobs.send((d, batch, tx));
        rx
    }
}

/// The workers' per-stream counts added up.
fn sum_counts<'a>(each: impl Iterator<Item = &'a [StreamCount]> + Clone) -> Vec<StreamCount> {
    let mut total = vec![StreamCount::default(); each.clone().map(<[_]>::len).max().unwrap_or(0)];
    for counts in each {
        for (t, c) in total.iter_mut().zip(counts) {
            t.sent += c.sent;
            t.late += c.late;
            t.errors += c.errors;
        }
    }
    total
}

/// The workers' runs as one: their counts summed, and the seconds over
/// which the summed frames went at the sum of the workers' rates (each
/// worker's frames over its own seconds). With one worker, its run.
fn join_runs(each: &[(Vec<StreamCount>, f64)]) -> (Vec<StreamCount>, f64) {
    let counts = sum_counts(each.iter().map(|(c, _)| c.as_slice()));
    let frames = |c: &[StreamCount]| c.iter().map(|s| s.sent).sum::<u64>() as f64;
    let rate: f64 = each.iter().filter(|(_, secs)| *secs > 0.0).map(|(c, secs)| frames(c) / secs).sum();
    let total = frames(&counts);
    let secs = if rate > 0.0 { total / rate } else { each.iter().map(|(_, s)| *s).fold(0.0, f64::max) };
    (counts, secs)
}

/// Set the calling thread's nice value (Linux: a thread is a task of its own for setpriority).
pub(crate) fn set_thread_nice(nice: i32) -> Result<()> {
    // SAFETY: setpriority on our own thread id.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    anyhow::ensure!(r == 0, "setting a thread's nice to {nice}: {}", std::io::Error::last_os_error());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(sent: u64) -> StreamCount {
        StreamCount { sent, late: 1, errors: 0 }
    }

    #[test]
    fn workers_runs_join_into_their_summed_counts_at_their_summed_rate() {
        // 1000 frames in 1 s and 500 in 0.5 s: 2000/s together, 1500 frames.
        let (counts, secs) = join_runs(&[(vec![count(1000)], 1.0), (vec![count(500)], 0.5)]);
        assert_eq!(counts, vec![StreamCount { sent: 1500, late: 2, errors: 0 }]);
        assert!((1500.0 / secs - 2000.0).abs() < 1e-6, "{secs}");
        // One worker: its own run.
        assert_eq!(join_runs(&[(vec![count(10), count(20)], 2.0)]), (vec![count(10), count(20)], 2.0));
        // Nothing sent: the longest run's seconds, never a division by zero.
        let (c, secs) = join_runs(&[(vec![count(0)], 1.0), (vec![count(0)], 3.0)]);
        assert_eq!((c[0].sent, secs), (0, 3.0));
    }
}
