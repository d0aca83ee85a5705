//! A Tokio runtime owned by a component (queries, segment file I/O), kept apart from the
//! HTTP workers so their CPU or I/O work never runs on the actix event loop.

use std::future::Future;
use std::sync::mpsc;

/// Owns a runtime; dropping it from inside another runtime is allowed (it shuts down in the
/// background instead of blocking).
pub struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    /// A multi-threaded runtime with `threads` workers named `name`, with I/O and timers.
    pub fn new(name: &str, threads: usize) -> std::io::Result<OwnedRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(OwnedRuntime(Some(runtime)))
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle(),
            None => unreachable!("the runtime is only taken when dropped"),
        }
    }

    /// Runs `work` on this runtime and waits for it from a plain (blocking) thread. Unlike
    /// `block_on`, this may be called from any thread, including a blocking-pool thread of
    /// another runtime; it must not be called from this runtime's own workers.
    pub fn wait<T, F>(&self, work: F) -> std::io::Result<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let _ = tx.send(work.await);
        });
        rx.recv()
            .map_err(|_| std::io::Error::other("the runtime stopped before the work finished"))
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_from_a_plain_thread_and_from_inside_another_runtime() {
        let owned = OwnedRuntime::new("test-io", 1).expect("runtime");
        assert_eq!(owned.wait(async { 2 + 2 }).expect("result"), 4);
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let got = other.block_on(async { owned.wait(async { 7 }).expect("result") });
        assert_eq!(got, 7);
    }
}
