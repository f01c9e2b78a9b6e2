//! A stage's independent pieces of work (a window's or a batch's columns)
//! shared out among short-lived helper threads.

/// Run `work` on each of `items`, shared among `workers` threads (the
/// calling one and helpers named `name`, each of which calls `after` once
/// there is no item left), each taking the next item as it finishes one:
/// items of uneven cost (a window's looked-up columns against its 2-byte
/// keys) keep every thread busy to the end. Returns the results in item
/// order. A panic on a helper resumes on the calling thread, where the stage
/// reports it as its error.
pub fn share_out<T: Send, R: Send>(
    items: Vec<T>,
    workers: usize,
    name: &str,
    work: &(dyn Fn(T) -> R + Sync),
    after: &(dyn Fn() + Sync),
) -> Vec<R> {
    let n = items.len();
    let workers = workers.clamp(1, n.max(1));
    if workers == 1 {
        return items.into_iter().map(work).collect();
    }
    // Held only while an item is taken, never while one is worked on.
    let queue = std::sync::Mutex::new(items.into_iter().enumerate());
    let take = || queue.lock().unwrap_or_else(|p| p.into_inner()).next();
    let run = || {
        let mut out = Vec::new();
        while let Some((i, item)) = take() {
            out.push((i, work(item)));
        }
        out
    };
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..workers)
            .map(|_| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(s, || {
                        let out = run();
                        after();
                        out
                    })
                    .expect("spawn a helper thread")
            })
            .collect();
        let mut all = vec![run()];
        for h in helpers {
            all.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for (i, r) in done.into_iter().flatten() {
        out[i] = Some(r);
    }
    out.into_iter()
        .map(|r| r.expect("every item is taken once"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn results_come_in_item_order_and_every_helper_finishes() {
        for workers in [0, 1, 2, 3, 7, 20] {
            let afters = AtomicUsize::new(0);
            let out = share_out((0..10u64).collect(), workers, "test", &|x| x * x, &|| {
                afters.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(out, (0..10u64).map(|x| x * x).collect::<Vec<_>>());
            assert_eq!(afters.load(Ordering::SeqCst), workers.clamp(1, 10) - 1);
        }
        assert!(share_out(Vec::<u8>::new(), 4, "test", &|x| x, &|| ()).is_empty());
    }

    #[test]
    fn a_helper_panic_resumes_on_the_calling_thread() {
        let caught = std::panic::catch_unwind(|| {
            share_out(
                (0..4).collect(),
                2,
                "test",
                &|x: i32| assert!(x != 3, "item 3"),
                &|| (),
            )
        });
        assert!(caught.is_err());
    }
}
