//! The long-running tasks of `run`, each with its name, watched while
//! they run: a task that ends before the shutdown (it returned, or it
//! panicked) is a defect the process cannot mend by itself. The watch says
//! which task and why in one line, starts the graceful stop of the others
//! (the publisher releases its leases, the expiry's batch commits or rolls
//! back) and the process exits non-zero, for the orchestrator to restart
//! it. Restarting the task in place was not chosen: a task that died
//! halfway may have left state the others share (a handoff closed, a
//! health flag), and a fresh process is the one restart known to be clean.
//!
//! Panics unwind (the release profile keeps `panic = "unwind"`): tokio
//! catches a task's panic, so its name and message reach the log as one
//! line and the other tasks stop in order. With `panic = "abort"` the
//! process would die at once, with the default hook's line only and the
//! leases left to run out.

use std::{collections::HashMap, future::Future};

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

/// A task that ended before the shutdown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {task} task {reason}")]
pub struct TaskEnded {
    pub task: &'static str,
    /// `ended` (it returned) or `panicked: <message>`.
    pub reason: String,
}

/// The named tasks of a command.
#[derive(Debug, Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Tasks {
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Waits until `shutdown` is cancelled, or until a task ends before it:
    /// then it says so in one line, cancels `shutdown` (the others stop as
    /// at a signal) and returns which task and why.
    pub async fn watch(&mut self, shutdown: &CancellationToken) -> Option<TaskEnded> {
        let ended = tokio::select! {
            // A stop asked for comes first: tasks end because of it.
            biased;
            () = shutdown.cancelled() => return None,
            ended = self.set.join_next_with_id() => ended?,
        };
        let ended = self.describe(ended);
        if shutdown.is_cancelled() {
            // It ended as the stop began (the signal and its end raced).
            if ended.reason != "ended" {
                tracing::error!(task = ended.task, reason = %ended.reason, "task ended abnormally while stopping");
            }
            return None;
        }
        tracing::error!(
            task = ended.task,
            reason = %ended.reason,
            "a task ended while the process runs; stopping it (exit 70) for the orchestrator to restart"
        );
        shutdown.cancel();
        Some(ended)
    }

    /// Waits for every task to end (after the shutdown); a task that
    /// panicked meanwhile is logged.
    pub async fn join_all(&mut self) {
        while let Some(ended) = self.set.join_next_with_id().await {
            if ended.is_err() {
                let ended = self.describe(ended);
                tracing::error!(task = ended.task, reason = %ended.reason, "task ended abnormally while stopping");
            }
        }
    }

    pub fn abort_all(&mut self) {
        self.set.abort_all();
    }

    fn describe(&self, ended: Result<(Id, ()), JoinError>) -> TaskEnded {
        let (id, reason) = match ended {
            Ok((id, ())) => (id, "ended".to_owned()),
            Err(error) => {
                let id = error.id();
                let reason = if error.is_panic() {
                    let payload = error.into_panic();
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(no message)".to_owned());
                    format!("panicked: {message}")
                } else {
                    "was cancelled".to_owned()
                };
                (id, reason)
            }
        };
        TaskEnded {
            task: self.names.get(&id).copied().unwrap_or("unnamed"),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A task that panics while the others run: the watch names it and
    /// why, and stops the others through the shutdown token.
    #[tokio::test]
    async fn a_panicking_task_is_named_and_stops_the_others() {
        let shutdown = CancellationToken::new();
        let mut tasks = Tasks::default();
        let stopped = CancellationToken::new();
        tasks.spawn("expiry", {
            let (shutdown, stopped) = (shutdown.clone(), stopped.clone());
            async move {
                shutdown.cancelled().await;
                stopped.cancel();
            }
        });
        tasks.spawn("publisher", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("boom");
        });
        let ended = tasks.watch(&shutdown).await;
        assert_eq!(
            ended,
            Some(TaskEnded {
                task: "publisher",
                reason: "panicked: boom".to_owned(),
            })
        );
        assert!(shutdown.is_cancelled());
        tasks.join_all().await;
        assert!(stopped.is_cancelled(), "the other task stopped");
    }

    /// A task that returns before the shutdown is as unexpected.
    #[tokio::test]
    async fn a_task_that_returns_early_is_named() {
        let shutdown = CancellationToken::new();
        let mut tasks = Tasks::default();
        tasks.spawn("listener", async {});
        let ended = tasks.watch(&shutdown).await.expect("it ended");
        assert_eq!((ended.task, ended.reason.as_str()), ("listener", "ended"));
        assert_eq!(ended.to_string(), "the listener task ended");
    }

    /// A task that ends because of the stop (it raced the watch) is not
    /// reported.
    #[tokio::test]
    async fn a_task_ending_at_the_stop_is_not_reported() {
        let shutdown = CancellationToken::new();
        let mut tasks = Tasks::default();
        tasks.spawn("http", {
            let shutdown = shutdown.clone();
            async move { shutdown.cancelled().await }
        });
        shutdown.cancel();
        // Let the task end before the watch looks.
        tokio::task::yield_now().await;
        assert_eq!(tasks.watch(&shutdown).await, None);
    }

    /// At a signal, nothing is reported.
    #[tokio::test]
    async fn the_shutdown_reports_nothing() {
        let shutdown = CancellationToken::new();
        let mut tasks = Tasks::default();
        tasks.spawn("http", {
            let shutdown = shutdown.clone();
            async move { shutdown.cancelled().await }
        });
        shutdown.cancel();
        assert_eq!(tasks.watch(&shutdown).await, None);
        tasks.join_all().await;
    }
}
