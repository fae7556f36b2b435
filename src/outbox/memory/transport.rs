//! [`ScriptedTransport`]: a broker whose partitions answer as scripted.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use crate::outbox::transport::{ErrorClass, OutgoingRecord, SendError, Transport};

/// How a partition answers a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Writes the records and acknowledges them.
    Ack,
    /// Writes and acknowledges them after this long.
    AckAfter(Duration),
    /// Writes nothing and fails with this error.
    Fail(SendError),
    /// Writes the records, then the answer is lost (a connection reset
    /// mid-request): fails with this (retriable) error.
    WriteThenFail(SendError),
    /// Never answers: the request fails with `CLIENT_TIMEOUT` after the
    /// transport's timeout, as the Kafka transport's does.
    Hang,
}

/// A record the broker wrote, where and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub topic: String,
    pub partition: i32,
    pub record: OutgoingRecord,
    pub at: Instant,
}

#[derive(Debug)]
struct State {
    /// How long a request waits for an answer that does not come
    /// ([`Answer::Hang`]) before it fails as the Kafka transport does.
    timeout: Duration,
    /// Partition count by topic; a topic not here does not exist.
    topics: BTreeMap<String, i32>,
    /// The standing answer of a partition (default: [`Answer::Ack`]).
    answers: BTreeMap<(String, i32), Answer>,
    /// Answers used once each, before the standing one.
    next: BTreeMap<(String, i32), VecDeque<Answer>>,
    /// A metadata read fails with this while set.
    metadata_error: Option<SendError>,
    /// Requests that hold one of these keys are refused as too large.
    refused_keys: HashSet<String>,
    written: Vec<Written>,
    /// Requests per partition, and when each started.
    requests: BTreeMap<(String, i32), Vec<Instant>>,
    in_flight: BTreeMap<(String, i32), usize>,
    max_in_flight: usize,
    metadata_reads: usize,
}

impl Default for State {
    fn default() -> Self {
        Self {
            timeout: crate::outbox::Timing::default().request_timeout,
            topics: BTreeMap::new(),
            answers: BTreeMap::new(),
            next: BTreeMap::new(),
            metadata_error: None,
            refused_keys: HashSet::new(),
            written: Vec::new(),
            requests: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            max_in_flight: 0,
            metadata_reads: 0,
        }
    }
}

/// A scripted broker; clones share it.
#[derive(Debug, Clone, Default)]
pub struct ScriptedTransport {
    state: Arc<Mutex<State>>,
}

impl ScriptedTransport {
    /// A broker with `topic` of `partitions` partitions.
    pub fn new(topic: &str, partitions: i32) -> Self {
        let transport = Self::default();
        transport.set_partitions(topic, partitions);
        transport
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked holding the lock already failed.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Requests that get no answer fail after `timeout`.
    pub fn set_timeout(&self, timeout: Duration) {
        self.state().timeout = timeout;
    }

    /// Creates or grows `topic`.
    pub fn set_partitions(&self, topic: &str, partitions: i32) {
        self.state().topics.insert(topic.to_owned(), partitions);
    }

    /// From now on, `partition` of `topic` answers every request so.
    pub fn answer(&self, topic: &str, partition: i32, answer: Answer) {
        self.state()
            .answers
            .insert((topic.to_owned(), partition), answer);
    }

    /// The next requests of the partition get these answers, once each.
    pub fn answer_next(
        &self,
        topic: &str,
        partition: i32,
        answers: impl IntoIterator<Item = Answer>,
    ) {
        self.state()
            .next
            .entry((topic.to_owned(), partition))
            .or_default()
            .extend(answers);
    }

    pub fn fail_metadata(&self, error: Option<SendError>) {
        self.state().metadata_error = error;
    }

    /// Requests holding one of `keys` are refused (`MESSAGE_TOO_LARGE`).
    pub fn refuse_keys(&self, keys: impl IntoIterator<Item = String>) {
        self.state().refused_keys.extend(keys);
    }

    /// Every record written, in order.
    pub fn written(&self) -> Vec<Written> {
        self.state().written.clone()
    }

    /// When each request to the partition started.
    pub fn requests(&self, topic: &str, partition: i32) -> Vec<Instant> {
        self.state()
            .requests
            .get(&(topic.to_owned(), partition))
            .cloned()
            .unwrap_or_default()
    }

    /// The most requests one partition ever had on the way at once.
    pub fn max_in_flight(&self) -> usize {
        self.state().max_in_flight
    }

    pub fn metadata_reads(&self) -> usize {
        self.state().metadata_reads
    }

    /// Starts a request: its answer, after counting it.
    fn begin(&self, key: &(String, i32)) -> Answer {
        let mut state = self.state();
        state
            .requests
            .entry(key.clone())
            .or_default()
            .push(Instant::now());
        let in_flight = state.in_flight.entry(key.clone()).or_default();
        *in_flight += 1;
        let now_in_flight = *in_flight;
        state.max_in_flight = state.max_in_flight.max(now_in_flight);
        if let Some(answer) = state.next.get_mut(key).and_then(VecDeque::pop_front) {
            return answer;
        }
        state.answers.get(key).cloned().unwrap_or(Answer::Ack)
    }

    fn write(&self, key: &(String, i32), records: &[OutgoingRecord]) {
        let mut state = self.state();
        let at = Instant::now();
        for record in records {
            state.written.push(Written {
                topic: key.0.clone(),
                partition: key.1,
                record: record.clone(),
                at,
            });
        }
    }

    fn end(&self, key: &(String, i32)) {
        if let Some(n) = self.state().in_flight.get_mut(key) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Counts a request as ended when dropped (answered or abandoned).
struct Ending<'a>(&'a ScriptedTransport, (String, i32));

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        self.0.end(&self.1);
    }
}

impl Transport for ScriptedTransport {
    async fn partitions(&self, topic: &str) -> Result<i32, SendError> {
        let mut state = self.state();
        state.metadata_reads += 1;
        if let Some(error) = &state.metadata_error {
            return Err(error.clone());
        }
        state.topics.get(topic).copied().ok_or_else(|| {
            SendError::new(
                ErrorClass::Fatal,
                "UNKNOWN_TOPIC_OR_PARTITION",
                format!("topic {topic:?} does not exist"),
            )
        })
    }

    async fn produce(
        &self,
        topic: &str,
        partition: i32,
        partitions: i32,
        records: Vec<OutgoingRecord>,
    ) -> Result<(), SendError> {
        let key = (topic.to_owned(), partition);
        let answer = self.begin(&key);
        // As the Kafka transport: records routed for another partition
        // count than the topic has now are not sent.
        if let Some(now) = self.state().topics.get(topic).copied()
            && now != partitions
        {
            let _ending = Ending(self, key.clone());
            return Err(SendError::new(
                ErrorClass::Retriable,
                crate::outbox::transport::LAYOUT_CHANGED,
                format!(
                    "topic {topic:?} has {now} partitions; the rows were routed for {partitions}"
                ),
            ));
        }
        let _ending = Ending(self, key.clone());
        if records
            .iter()
            .any(|r| self.state().refused_keys.contains(&r.key))
        {
            return Err(SendError::new(
                ErrorClass::Refused,
                "MESSAGE_TOO_LARGE",
                "the request is too large",
            ));
        }
        match answer {
            Answer::Ack => {
                self.write(&key, &records);
                Ok(())
            }
            Answer::AckAfter(latency) => {
                tokio::time::sleep(latency).await;
                self.write(&key, &records);
                Ok(())
            }
            Answer::Fail(error) => Err(error),
            Answer::WriteThenFail(error) => {
                self.write(&key, &records);
                Err(error)
            }
            Answer::Hang => {
                let timeout = self.state().timeout;
                tokio::time::sleep(timeout).await;
                Err(SendError::new(
                    ErrorClass::Retriable,
                    "CLIENT_TIMEOUT",
                    format!("no answer within {timeout:?} (scripted)"),
                ))
            }
        }
    }
}
