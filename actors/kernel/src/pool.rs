//! A small pool of named threads with a bounded queue, for expensive work a stranger can ask
//! for (password verification): it cannot take the shared blocking pool's threads, and when
//! the queue is full the caller is told at once instead of waiting behind everyone else.

use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TrySendError};

type Job = Box<dyn FnOnce() + Send>;

/// The pool's queue is full: retry later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {0} pool is busy")]
pub struct Busy(pub &'static str);

pub struct BoundedPool {
    name: &'static str,
    jobs: Sender<Job>,
    _threads: Vec<JoinHandle<()>>,
}

impl BoundedPool {
    /// `threads` workers named `corvid-<name>`, with room for `queue` waiting jobs.
    pub fn new(name: &'static str, threads: usize, queue: usize) -> std::io::Result<BoundedPool> {
        let (jobs, rx) = crossbeam_channel::bounded::<Job>(queue);
        let threads = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("corvid-{name}-{i}"))
                    .spawn(move || {
                        for job in rx {
                            // A panicking job drops its answer channel; the caller sees that.
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(BoundedPool {
            name,
            jobs,
            _threads: threads,
        })
    }

    /// Queues `work`, or answers `Err(Busy)` at once when the queue is full. The future
    /// resolves to its answer, `None` when `work` panicked.
    pub fn submit<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<impl std::future::Future<Output = Option<T>>, Busy> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(work());
        });
        match self.jobs.try_send(job) {
            Ok(()) => Ok(async move { rx.await.ok() }),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(Busy(self.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[tokio::test]
    async fn a_full_queue_answers_busy_at_once() {
        let pool = BoundedPool::new("test", 1, 1).expect("pool");
        let gate = Arc::new(Barrier::new(2));
        let held = Arc::clone(&gate);
        let first = pool
            .submit(move || {
                held.wait();
                1
            })
            .expect("submitted");
        // The worker takes the first job and blocks on the barrier: one more fits in the
        // queue, the next is refused.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let second = pool.submit(|| 2).expect("queued");
        assert_eq!(pool.submit(|| 3).err(), Some(Busy("test")));
        gate.wait();
        assert_eq!(first.await, Some(1));
        assert_eq!(second.await, Some(2));
        let panicked = pool.submit(|| -> u8 { panic!("boom") }).expect("queued");
        assert_eq!(panicked.await, None);
    }
}
