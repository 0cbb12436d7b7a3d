//! The scan of the gate's source maps, on a thread of its own.
//!
//! Reading the whole "sources" map (262,144 entries) takes tens of
//! milliseconds: the control thread, a 10 ms tick at SCHED_FIFO, must not
//! spend them. Every `sources::SCAN_EVERY` this thread reads the "sources" and "known"
//! maps through handles of its own, sums them up per class
//! (`sources::scan`), and works out which known entries are past their
//! class's part of the map (`known::bound`). The control thread takes the
//! result at a tick (`take`) and applies the bound only if the config the
//! scan was made for is still in force: class ids change with a reload.
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::MapHandle;

use crate::bpf_intf::{sluice_known, sluice_src, sluice_src_key};
use crate::gate::dump_map;
use crate::{known, sources};

/// The config a scan works for: its generation (one per switch), its class
/// count, the classes that learn clients, and the known map's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub generation: u64,
    pub classes: usize,
    pub learning: usize,
    pub known_capacity: u32,
}

/// What one scan found.
pub struct Found {
    pub shape: Shape,
    /// Per class: entries of the sources map, known sources, heaviest droppers.
    pub per_class: Vec<(u64, u64, Vec<sources::TopSource>)>,
    /// Entries of the sources map.
    pub entries: u64,
    /// How long the reads and sums took (ms).
    pub ms: f64,
    /// The known map as read.
    pub known: Vec<(sluice_src_key, sluice_known)>,
    /// Known entries past their class's part, and each class's room for new ones.
    pub delete: Vec<sluice_src_key>,
    pub room: Vec<i64>,
}

/// The scanning thread; it stops when this is dropped.
pub struct SourceScan {
    shape: Arc<Mutex<Shape>>,
    found: Receiver<Result<Found>>,
    /// Replaced at drop: the thread's wait then ends at once and it returns.
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl SourceScan {
    /// Scan the maps every `every`, first after one `every`, for `shape`.
    pub fn start(maps: (MapHandle, MapHandle), shape: Shape, every: Duration) -> SourceScan {
        let shape = Arc::new(Mutex::new(shape));
        let (tx, found) = mpsc::sync_channel(1);
        let (stop_tx, stop) = mpsc::channel::<()>();
        let thread = {
            let shape = shape.clone();
            std::thread::Builder::new()
                .name("sluice-scan".into())
                .spawn(move || loop {
                    match stop.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let s = *shape.lock().unwrap();
                    // A full channel: the control thread has not taken the last one yet.
                    if let Err(mpsc::TrySendError::Disconnected(_)) = tx.try_send(scan(&maps, s)) {
                        return;
                    }
                })
                .expect("spawning the source scan thread")
        };
        SourceScan { shape, found, stop: stop_tx, thread: Some(thread) }
    }

    /// Scan for this config from the next scan on.
    pub fn follow(&self, shape: Shape) {
        *self.shape.lock().unwrap() = shape;
    }

    /// The last scan's result, if one came since the last call.
    pub fn take(&self) -> Option<Result<Found>> {
        self.found.try_recv().ok()
    }
}

impl Drop for SourceScan {
    fn drop(&mut self) {
        self.stop = mpsc::channel().0;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One scan of both maps for `shape`.
fn scan((sources_map, known_map): &(MapHandle, MapHandle), shape: Shape) -> Result<Found> {
    let t = Instant::now();
    let sources: Vec<(sluice_src_key, sluice_src)> = dump_map(sources_map, "sources")?;
    let known: Vec<(sluice_src_key, sluice_known)> = dump_map(known_map, "known")?;
    let per_class = sources::scan(&sources, &known, shape.classes);
    let part = known::part(shape.known_capacity, shape.learning);
    let (delete, room) = known::bound(&known, shape.classes, part);
    Ok(Found {
        shape,
        per_class,
        entries: sources.len() as u64,
        ms: t.elapsed().as_secs_f64() * 1e3,
        known,
        delete,
        room,
    })
}
