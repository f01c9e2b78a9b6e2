//! A trace of the pipeline in the Chrome trace-event format (JSON array),
//! which ui.perfetto.dev and chrome://tracing open: a track per thread, a
//! span per fetch, decode (with shard and row group), shuffled window,
//! collated batch and consumer wait, and counters of the decode queue.
//!
//! Events go through a bounded channel to a writer thread that streams them
//! to the file, so memory stays bounded however long the run: when the
//! writer falls behind, events are dropped and counted (the file's last
//! event says how many).

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError, bounded};

use crate::error::{LoaderError, Result};

/// Events queued for the writer at most.
const QUEUE: usize = 1 << 16;

/// A span's or counter's arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Args {
    None,
    /// A row group of a shard (by index in the manifest).
    RowGroup {
        shard: u32,
        row_group: u32,
    },
    /// A window or batch index.
    Index(u64),
}

enum Event {
    Span {
        name: &'static str,
        tid: u32,
        start: Duration,
        dur: Duration,
        args: Args,
    },
    Counter {
        name: &'static str,
        at: Duration,
        value: u64,
    },
    Thread {
        tid: u32,
        name: String,
    },
}

/// Tracers made so far: each one's identity.
static NEXT_TRACER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's id in each trace it wrote to: (tracer, tid).
    static TIDS: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Writes a trace file while the loader runs; finished when dropped.
pub(crate) struct Tracer {
    /// This tracer's identity, for the threads' ids in it.
    id: u64,
    /// The next thread id in this trace.
    next_tid: AtomicU32,
    origin: Instant,
    tx: Option<Sender<Event>>,
    dropped: std::sync::Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
    /// The first write error of the trace file, once there is one.
    failed: TraceOutcome,
}

/// How the writing of a loader's trace file went: read it once the loader
/// is dropped (the file is finished then); a full disk or a failing device
/// is an error here, not a trace silently cut short.
#[derive(Clone, Debug, Default)]
pub struct TraceOutcome(std::sync::Arc<std::sync::OnceLock<String>>);

impl TraceOutcome {
    /// The first error met while writing the trace, if any.
    pub fn error(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    fn fail(&self, path: &Path, error: std::io::Error) {
        let _ = self.0.set(format!(
            "cannot write trace file {}: {error}",
            path.display()
        ));
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").finish_non_exhaustive()
    }
}

impl Tracer {
    /// Start writing a trace to `path`.
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|source| LoaderError::Io {
            op: format!("create trace file {}", path.display()),
            source,
        })?;
        let (tx, rx) = bounded::<Event>(QUEUE);
        let dropped = std::sync::Arc::new(AtomicU64::new(0));
        let lost = dropped.clone();
        let failed = TraceOutcome::default();
        let outcome = failed.clone();
        let path = path.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("shardfeed-trace".into())
            .spawn(move || {
                let mut out = BufWriter::new(file);
                let mut first = true;
                let mut written = out.write_all(b"[\n");
                for event in rx {
                    // After an error the events are drained, not written.
                    if written.is_ok() {
                        written = write_event(&mut out, &event, &mut first);
                    }
                }
                let written = written
                    .and_then(|()| {
                        write!(
                            out,
                            "{}{{\"name\":\"shardfeed_trace_dropped_events\",\"ph\":\"C\",\"ts\":0,\"pid\":1,\"args\":{{\"dropped\":{}}}}}\n]\n",
                            if first { "" } else { ",\n" },
                            lost.load(Ordering::Relaxed)
                        )
                    })
                    .and_then(|()| out.flush())
                    .and_then(|()| out.get_ref().sync_data());
                if let Err(e) = written {
                    outcome.fail(&path, e);
                }
            })
            .map_err(|source| LoaderError::Io {
                op: "start the trace writer".into(),
                source,
            })?;
        Ok(Tracer {
            id: NEXT_TRACER.fetch_add(1, Ordering::Relaxed),
            next_tid: AtomicU32::new(1),
            origin: Instant::now(),
            tx: Some(tx),
            dropped,
            writer: Some(writer),
            failed,
        })
    }

    /// How the writing goes (final once the tracer is dropped).
    pub(crate) fn outcome(&self) -> TraceOutcome {
        self.failed.clone()
    }

    fn send(&self, event: Event) {
        if let Some(tx) = &self.tx
            && let Err(TrySendError::Full(_)) = tx.try_send(event)
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This thread's id in this trace, named there on first use (a thread,
    /// such as the consumer's, may write to the traces of several loaders).
    fn tid(&self) -> u32 {
        TIDS.with(|tids| {
            let mut tids = tids.borrow_mut();
            if let Some(&(_, tid)) = tids.iter().find(|(tracer, _)| *tracer == self.id) {
                return tid;
            }
            let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
            // Tracers of loaders since dropped are forgotten.
            tids.retain(|(tracer, _)| *tracer > self.id.saturating_sub(64));
            tids.push((self.id, tid));
            let name = std::thread::current()
                .name()
                .unwrap_or("consumer")
                .to_string();
            self.send(Event::Thread {
                tid,
                name: format!("{name} #{tid}"),
            });
            tid
        })
    }

    /// A span `name` on this thread from `started` for `dur`.
    pub(crate) fn span(&self, name: &'static str, started: Instant, dur: Duration, args: Args) {
        let tid = self.tid();
        self.send(Event::Span {
            name,
            tid,
            start: started.saturating_duration_since(self.origin),
            dur,
            args,
        });
    }

    /// Counter `name` at `value` now.
    pub(crate) fn counter(&self, name: &'static str, value: u64) {
        self.send(Event::Counter {
            name,
            at: self.origin.elapsed(),
            value,
        });
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish the file.
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn write_event(out: &mut impl Write, event: &Event, first: &mut bool) -> std::io::Result<()> {
    if !*first {
        out.write_all(b",\n")?;
    }
    *first = false;
    match event {
        Event::Span {
            name,
            tid,
            start,
            dur,
            args,
        } => {
            write!(
                out,
                "{{\"name\":\"{name}\",\"cat\":\"shardfeed\",\"ph\":\"X\",\"pid\":1,\"tid\":{tid},\"ts\":{:.3},\"dur\":{:.3}",
                us(*start),
                us(*dur)
            )?;
            match args {
                Args::None => {}
                Args::RowGroup { shard, row_group } => write!(
                    out,
                    ",\"args\":{{\"shard\":{shard},\"row_group\":{row_group}}}"
                )?,
                Args::Index(i) => write!(out, ",\"args\":{{\"index\":{i}}}")?,
            }
            out.write_all(b"}")
        }
        Event::Counter { name, at, value } => write!(
            out,
            "{{\"name\":\"{name}\",\"ph\":\"C\",\"pid\":1,\"ts\":{:.3},\"args\":{{\"value\":{value}}}}}",
            us(*at)
        ),
        Event::Thread { tid, name } => write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
            serde_json::to_string(name).unwrap_or_else(|_| "\"thread\"".into())
        ),
    }
}
