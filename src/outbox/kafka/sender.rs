//! The thread the Kafka client runs on, as the Java producer's sender
//! thread: rskafka's encoding, its connections' reads and writes and the
//! bridge's relays run on a runtime of their own. The process's runtime
//! keeps the database work (the publisher's rounds, the expiry) and the
//! HTTP server: an encode of 500 records never holds up a round's rows on
//! their way in, and a round never holds up a request's answer.
//!
//! The thread starts at the transport's first call and ends when the
//! transport is dropped (its runtime drops the tasks still there). A call
//! dropped by its caller (a timeout, a shutdown) is dropped on the thread
//! too, as if it had run in place.

use std::{future::Future, thread};

use tokio::{runtime, sync::oneshot, task::JoinHandle};

/// The sender thread's runtime, while the thread runs.
#[derive(Debug)]
pub(super) struct Sender {
    handle: runtime::Handle,
    /// Dropped with the transport: the thread's runtime then ends.
    _stop: oneshot::Sender<()>,
}

impl Sender {
    /// Starts the thread; `None` (with a warning) when the system refuses a
    /// thread or a runtime, and the calls then run on the caller's runtime.
    pub(super) fn start() -> Option<Self> {
        match Self::try_start() {
            Ok(sender) => Some(sender),
            Err(error) => {
                tracing::warn!(%error, "cannot start the Kafka sender thread; Kafka requests run on the worker's runtime");
                None
            }
        }
    }

    fn try_start() -> std::io::Result<Self> {
        let runtime = runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        thread::Builder::new()
            .name("kafka-sender".into())
            .spawn(move || {
                // Ends when the transport drops its end of the channel.
                let _ = runtime.block_on(stopped);
            })?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    /// Runs `work` on the sender thread and returns its output; `None`
    /// when the thread's runtime is gone (the transport is being dropped).
    pub(super) async fn run<F>(&self, work: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let mut task = AbortOnDrop(self.handle.spawn(work));
        match (&mut task.0).await {
            Ok(output) => Some(output),
            // A panic there is a bug here: it goes on in the caller.
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => None,
        }
    }
}

/// A task on the sender thread, dropped there when its caller drops it.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_on_its_own_thread_and_drops_what_its_caller_drops() {
        let sender = Sender::start().expect("a thread starts");
        let name = sender
            .run(async { thread::current().name().map(str::to_owned) })
            .await;
        assert_eq!(name, Some(Some("kafka-sender".to_owned())));

        // A call its caller gives up on is dropped on the thread too.
        let (guard, dropped) = oneshot::channel::<()>();
        let call = sender.run(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
        // The guard's end closes when the task is dropped there.
        let closed = tokio::time::timeout(Duration::from_secs(5), dropped).await;
        assert!(
            matches!(closed, Ok(Err(_))),
            "the call was not dropped on the thread"
        );
    }
}
