//! Which threads run as batch work: the HTTP workers and the writers that work through a
//! queue (person commits, segment flushes, compaction, WAL housekeeping, freeing large
//! values) ask the kernel for `SCHED_BATCH` when they start, while the WAL writer and the
//! ingest shards keep the default policy.
//!
//! A thread woken under the default policy preempts the one running on its core. On a small
//! machine each captured event wakes an HTTP worker from the shard that acknowledges it, and
//! the worker then took the core from the shard (or from the WAL writer) in the middle of its
//! batch: a task switch each time, and the batch finished later. A batch thread woken waits
//! for the running thread's turn to end instead; its share of the CPU is the same. With a
//! million known persons doing `$set` on two cores, single-event capture went from
//! 20,500-23,700 to 24,900-26,500 requests a second (docs/PERFORMANCE.md).
//!
//! [`set_enabled`] (from `server.batch_scheduling`) is read once at start-up, before the
//! threads start; elsewhere than Linux [`join_batch`] does nothing.

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether threads that call [`join_batch`] from now on run as batch work.
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Puts the calling thread under `SCHED_BATCH` when enabled ([`set_enabled`]). A refusal by
/// the operating system is logged and otherwise ignored: the thread runs as before.
pub fn join_batch() {
    if ENABLED.load(Ordering::Relaxed) {
        if let Err(err) = set_batch_policy() {
            tracing::debug!(error = %err, "could not run this thread as batch work");
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_batch_policy() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is the calling
    // thread, and SCHED_BATCH with priority 0 is a policy any unprivileged thread may take.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_batch_policy() -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[allow(unsafe_code)]
    fn policy_of_this_thread() -> i32 {
        // SAFETY: pid 0 is the calling thread; sched_getscheduler reads its policy only.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_thread_joins_batch_work_only_when_enabled() {
        let policy_when = |enabled: bool| {
            std::thread::spawn(move || {
                if enabled {
                    set_enabled(true);
                }
                join_batch();
                policy_of_this_thread()
            })
            .join()
            .expect("thread")
        };
        assert_eq!(policy_when(false), libc::SCHED_OTHER);
        assert_eq!(policy_when(true), libc::SCHED_BATCH);
    }
}
