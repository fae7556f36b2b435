//! A consumer of `pin.crm.booking-expired.v1`: reads every partition (from
//! the beginning, or from given offsets), decodes each record, drops
//! duplicates by `ce_id`, prints one line per booking.
//!
//! ```sh
//! cargo run -p booking-expired-proto --example consume -- \
//!     --bootstrap-servers 127.0.0.1:9092 [--topic T] [--offsets 0:15,1:0] [--follow] [--idle-ms 3000]
//! ```

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use booking_expired_proto::{TOPIC, decode_record, v1::Phase};
use rskafka::client::{ClientBuilder, partition::UnknownTopicHandling};

struct Args {
    bootstrap: Vec<String>,
    topic: String,
    offsets: BTreeMap<i32, i64>,
    follow: bool,
    idle: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        bootstrap: vec!["127.0.0.1:9092".into()],
        topic: TOPIC.into(),
        offsets: BTreeMap::new(),
        follow: false,
        idle: Duration::from_millis(3000),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--bootstrap-servers" => {
                args.bootstrap = value()?.split(',').map(str::to_owned).collect()
            }
            "--topic" => args.topic = value()?,
            "--offsets" => {
                for pair in value()?.split(',') {
                    let (p, o) = pair.split_once(':').ok_or("offsets are PARTITION:OFFSET")?;
                    args.offsets.insert(
                        p.parse().map_err(|_| "bad partition")?,
                        o.parse().map_err(|_| "bad offset")?,
                    );
                }
            }
            "--follow" => args.follow = true,
            "--idle-ms" => {
                args.idle = Duration::from_millis(value()?.parse().map_err(|_| "bad --idle-ms")?)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let client = ClientBuilder::new(args.bootstrap.clone()).build().await?;
    let partitions = client
        .list_topics()
        .await?
        .into_iter()
        .find(|t| t.name == args.topic)
        .ok_or_else(|| format!("topic {} does not exist", args.topic))?
        .partitions;
    let mut readers = Vec::new();
    for partition in partitions {
        let pc = client
            .partition_client(args.topic.clone(), partition, UnknownTopicHandling::Error)
            .await?;
        readers.push((partition, pc, *args.offsets.get(&partition).unwrap_or(&0)));
    }
    let mut seen = HashSet::new();
    let (mut records, mut duplicates, mut invalid) = (0u64, 0u64, 0u64);
    let mut last_record = Instant::now();
    loop {
        let mut got_any = false;
        for (partition, pc, offset) in &mut readers {
            let (batch, _high_watermark) = pc.fetch_records(*offset, 1..10_000_000, 200).await?;
            for r in batch {
                *offset = r.offset + 1;
                got_any = true;
                records += 1;
                let value = r.record.value.unwrap_or_default();
                let headers = r.record.headers;
                match decode_record(
                    &value,
                    headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
                ) {
                    Ok(event) if !seen.insert(event.event_id) => duplicates += 1,
                    Ok(event) => println!(
                        "{} {:<7} booking {} tenant {} deal {} object {} expired_at {}s (p{} @{})",
                        event.event_id,
                        match event.phase {
                            Phase::Reserve => "Reserve",
                            _ => "Booking",
                        },
                        event.booking_id,
                        event.tenant_id,
                        event.deal_id,
                        event.property_object_id,
                        event.expired_at.seconds,
                        partition,
                        r.offset
                    ),
                    Err(error) => {
                        invalid += 1;
                        eprintln!("p{partition} @{}: invalid record: {error}", r.offset);
                    }
                }
            }
        }
        if got_any {
            last_record = Instant::now();
        } else if !args.follow && last_record.elapsed() >= args.idle {
            break;
        }
    }
    eprintln!(
        "records {records}, distinct events {}, duplicates dropped {duplicates}, invalid {invalid}",
        seen.len()
    );
    Ok(())
}
