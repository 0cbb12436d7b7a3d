//! The scan of the gate's source maps, on a thread of its own.
//!
//! Reading the whole "sources" table (262,144 slots, a walk of its
//! read-only mapping) and the known map takes milliseconds: the control
//! thread, a 10 ms tick at SCHED_FIFO, must not spend them. Every `source_tables::SCAN_EVERY` this thread reads the "sources" and "known"
//! maps through handles of its own, sums them up per class
//! (`source_tables::scan`), and works out which known entries are past their
//! class's part of the map (`known::bound`). The control thread takes the
//! result at a tick (`take`) and applies the bound only if the config the
//! scan was made for is still in force: class indexes change with a reload.
//!
//! Only the gate writes the sources map, and only for a class that counts
//! its sources (limited, with source fairness on). So the thread reads it
//! again only if some class counted since its last read (the control thread
//! says so each tick, `counting`) or the config changed; otherwise the last
//! read's summary stands. A host whose last flood filled the table does not
//! read its 262,144 slots every 5 s for nothing.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::MapHandle;

use crate::base::log;
use crate::bpf_intf::{sluice_known, sluice_known_part, sluice_src_key};
use crate::daemon::tick::FairStatus;
use crate::dataplane::gate::{dump_map, occupied_sources, Gate};
use crate::policy::config::Config;
use crate::policy::controller::TICK;
use crate::signals::source_tables;
use crate::surface::stats::{ClassTotals, Snapshot};

use super::known_store::Shape;

/// What one scan found.
pub struct Found {
    pub shape: Shape,
    /// Per class: entries of the sources map, known sources, heaviest droppers.
    pub per_class: Vec<(u64, u64, Vec<source_tables::TopSource>)>,
    /// Entries of the sources map.
    pub entries: u64,
    /// How long the reads and sums took (ms).
    pub ms: f64,
    /// Whether this scan read the sources map (false: the last read stands).
    pub sources_read: bool,
    /// The known map as read.
    pub known: Vec<(sluice_src_key, sluice_known)>,
    /// Known entries past their class's part, and each class's part (room, held) for the gate.
    pub delete: Vec<sluice_src_key>,
    pub parts: Vec<sluice_known_part>,
}

/// The scanning thread; it stops when this is dropped.
pub struct SourceScan {
    shape: Arc<Mutex<Shape>>,
    /// Set while some class counts its sources; the thread clears it when it reads the map.
    counted: Arc<AtomicBool>,
    found: Receiver<Result<Found>>,
    /// Replaced at drop: the thread's wait then ends at once and it returns.
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl SourceScan {
    /// Scan the maps every `every`, first after one `every`, for `shape`.
    pub fn start(maps: (MapHandle, MapHandle), shape: Shape, every: Duration) -> SourceScan {
        let shape = Arc::new(Mutex::new(shape));
        let counted = Arc::new(AtomicBool::new(true));
        let (tx, found) = mpsc::sync_channel(1);
        let (stop_tx, stop) = mpsc::channel::<()>();
        let thread = {
            let (shape, counted) = (shape.clone(), counted.clone());
            let mut last: Option<SourcesRead> = None;
            std::thread::Builder::new()
                .name("sluice-scan".into())
                .spawn(move || loop {
                    match stop.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let s = *shape.lock().unwrap();
                    let dirty = counted.swap(false, Ordering::Relaxed);
                    // A full channel: the control thread has not taken the last one yet.
                    if let Err(mpsc::TrySendError::Disconnected(_)) = tx.try_send(scan(&maps, s, dirty, &mut last)) {
                        return;
                    }
                })
                .expect("spawning the source scan thread")
        };
        SourceScan { shape, counted, found, stop: stop_tx, thread: Some(thread) }
    }

    /// Some class counts its sources now: the next scan reads the sources map.
    pub fn counting(&self, on: bool) {
        if on {
            self.counted.store(true, Ordering::Relaxed);
        }
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

/// The sources map's last read, summed per class for `shape`.
struct SourcesRead {
    shape: Shape,
    entries: u64,
    per_class: Vec<(u64, Vec<source_tables::TopSource>)>,
}

/// One scan for `shape`: the known map always, the sources map if `dirty`
/// (some class counted since the last read) or the shape changed.
fn scan(maps: &(MapHandle, MapHandle), shape: Shape, dirty: bool, last: &mut Option<SourcesRead>) -> Result<Found> {
    let t = Instant::now();
    let reuse = last.as_ref().is_some_and(|l| l.shape == shape) && !dirty;
    if !reuse {
        let mut sources = occupied_sources(&maps.0)?;
        shape.ids.to_classes(&mut sources);
        let per_class = source_tables::scan_sources(&sources, shape.classes);
        *last = Some(SourcesRead { shape, entries: sources.len() as u64, per_class });
    }
    let read = last.as_ref().expect("read above");
    let mut known: Vec<(sluice_src_key, sluice_known)> = dump_map(&maps.1, "known")?;
    shape.ids.to_classes(&mut known);
    let per_class = source_tables::combine(read.per_class.clone(), &source_tables::count_known(&known, shape.classes));
    let (delete, parts) = super::known_store::bound(&known, shape);
    Ok(Found {
        shape,
        per_class,
        entries: read.entries,
        ms: t.elapsed().as_secs_f64() * 1e3,
        sources_read: !reuse,
        known,
        delete,
        parts,
    })
}

/// What the last scan found, by the class indexes in force.
struct Scan {
    per_class: Vec<(u64, u64, Vec<source_tables::TopSource>)>,
    entries: u64,
    known: u64,
    /// The known map as read (what the minute's save offers).
    known_map: Vec<(sluice_src_key, sluice_known)>,
    ms: f64,
    /// Entries evicted so far, as of this scan (never less than the last's).
    evictions: u64,
    /// Each class's entries in the known map once the scan's bound applied.
    held: Vec<u64>,
}

/// The source scan as the daemon keeps it: the thread, the config it
/// follows, and the last scan taken.
pub(super) struct SourceTables {
    thread: SourceScan,
    shape: Shape,
    last: Option<Scan>,
}

impl SourceTables {
    /// Scan `gate`'s maps for `cfg`, the first config in force.
    pub fn start(gate: &Gate, cfg: &Config) -> anyhow::Result<SourceTables> {
        let shape = Shape::of(cfg, 0, gate);
        Ok(SourceTables {
            thread: SourceScan::start(gate.source_maps()?, shape, source_tables::SCAN_EVERY),
            shape,
            last: None,
        })
    }

    /// The config in force now (a new generation).
    pub fn follow(&mut self, cfg: &Config, gate: &Gate) {
        self.shape = Shape::of(cfg, self.shape.generation + 1, gate);
        self.thread.follow(self.shape);
        // The last scan's tables are by the old class indexes.
        if let Some(scan) = &mut self.last {
            (scan.per_class, scan.known_map) = (vec![], vec![]);
        }
    }

    /// The config the scan follows.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The known map as the last scan read it (None: no scan since the last switch).
    pub fn known_map(&self) -> Option<&[(sluice_src_key, sluice_known)]> {
        self.last.as_ref().map(|s| s.known_map.as_slice()).filter(|m| !m.is_empty())
    }

    /// Take the scan's result, if one came: apply its bound on the known map
    /// and keep its tables for status, if it was made for the config in force.
    pub fn take(&mut self, gate: &Gate, counting: bool) -> anyhow::Result<()> {
        self.thread.counting(counting);
        let found = match self.thread.take() {
            None => return Ok(()),
            Some(Ok(f)) if f.shape == self.shape => f,
            Some(Ok(_)) => return Ok(()),
            Some(Err(e)) => {
                log::warn(format_args!("the source maps were not read: {e:#}"));
                return Ok(());
            }
        };
        let Found { per_class, entries, ms, known: known_map, delete, parts, .. } = found;
        let held = parts.iter().map(|p| p.held).collect();
        super::known_store::apply_bound(gate, &delete, parts)?;
        let known = per_class.iter().map(|c| c.1).sum();
        let inserts = (0..self.shape.classes)
            .map(|id| Ok(ClassTotals::from(gate.class_counters(id)?).source_inserts))
            .sum::<anyhow::Result<u64>>()?;
        let before = self.last.as_ref().map_or(0, |s| s.evictions);
        let evictions = source_tables::evictions(before, inserts, entries);
        self.last = Some(Scan { per_class, entries, known, known_map, ms, evictions, held });
        Ok(())
    }

    /// Source fairness into the snapshot: the tick's quotas (`fair`, by
    /// class index), the counters' rates, the last scan's tables.
    pub fn fill(&self, snap: &mut Snapshot, fair: &[FairStatus], capacity: u32) {
        let parts = self.shape.parts();
        for (id, c) in snap.classes.iter_mut().enumerate() {
            let Some(f) = fair.get(id) else { continue };
            let scanned = self.last.as_ref().and_then(|s| s.per_class.get(id));
            let held = self.last.as_ref().and_then(|s| s.held.get(id)).copied();
            if !f.learning && f.quota.is_none() && scanned.is_none_or(|s| s.0 == 0 && s.1 == 0) {
                c.sources = None;
                continue;
            }
            c.sources = Some(source_tables::ClassSources {
                learning: f.learning,
                quota: f.quota.filter(|&q| q != crate::policy::fair::UNPACED),
                plen4: f.plens.0,
                plen6: f.plens.1,
                active_per_epoch: c.rates.source_epochs_ps * TICK.as_secs_f64(),
                known_pps: c.rates.known_pps,
                share_dropped_pps: c.rates.share_dropped_pps,
                known: scanned.map(|s| s.1),
                known_held: held,
                known_part: parts.get(id).copied(),
                tracked: scanned.map(|s| s.0),
                top: scanned.map(|s| s.2.clone()).unwrap_or_default(),
            });
        }
        let inserts = snap.classes.iter().map(|c| c.totals.source_inserts).sum();
        let last = self.last.as_ref();
        snap.sources = source_tables::SourcesMap {
            capacity,
            entries: last.map(|s| s.entries),
            inserts,
            evictions: last.map(|s| s.evictions),
            known: last.map(|s| s.known),
            scan_ms: last.map(|s| s.ms),
        };
    }
}
