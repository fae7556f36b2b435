package pin.crm.consumer;

import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * A reference consumer of pin.crm.booking-expired.v1: reads every record, checks it against the
 * contract (headers, protobuf value, key, partition), drops duplicates by {@code ce_id} and prints
 * one line per distinct event. Run with {@code --help} for the flags.
 */
public final class BookingExpiredConsumer {
    private static final String NAME = "booking-expired-consumer";
    /** At most this many invalid / misrouted records are described on stderr; all are counted. */
    private static final int MAX_REPORTED = 100;

    private final Options options;
    private final PrintWriter out;
    private final PrintWriter err;
    private volatile boolean stopRequested;

    long records;
    long distinct;
    long duplicates;
    long conflicting;
    long invalid;
    long misrouted;
    private int reported;
    /** ce_id -> hash of the first value seen with it (a republish sends identical bytes). */
    private final Map<String, Integer> seen = new HashMap<>();
    int partitionCount;
    private boolean summarized;

    BookingExpiredConsumer(Options options, PrintWriter out, PrintWriter err) {
        this.options = options;
        this.out = out;
        this.err = err;
    }

    public static void main(String[] args) {
        PrintWriter err = new PrintWriter(new OutputStreamWriter(System.err, StandardCharsets.UTF_8), true);
        Options options;
        try {
            options = Options.parse(args, System.getenv());
        } catch (Options.UsageException e) {
            err.println(NAME + ": " + e.getMessage());
            err.println("run with --help for the usage");
            System.exit(2);
            return;
        }
        if (options.help) {
            System.out.print(Options.USAGE);
            System.out.flush();
            return;
        }
        PrintWriter out = new PrintWriter(
                new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16), false);
        BookingExpiredConsumer consumer = new BookingExpiredConsumer(options, out, err);
        int code = consumer.runWithSignals();
        if (consumer.stopRequested) {
            // SIGINT/SIGTERM: the JVM is already shutting down; System.exit would block on our own hook.
            return;
        }
        System.exit(code);
    }

    /** Runs until done or SIGINT/SIGTERM; a signal stops the loop cleanly (summary still printed). */
    int runWithSignals() {
        Properties props = consumerProperties();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            Thread main = Thread.currentThread();
            Thread hook = new Thread(() -> {
                stopRequested = true;
                consumer.wakeup();
                try {
                    main.join(15_000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }, NAME + "-shutdown");
            Runtime.getRuntime().addShutdownHook(hook);
            try {
                return run(consumer);
            } finally {
                try {
                    Runtime.getRuntime().removeShutdownHook(hook);
                } catch (IllegalStateException shuttingDown) {
                    // the hook is running: it waits for this thread
                }
            }
        } catch (KafkaException e) {
            err.println(NAME + ": kafka error: " + e);
            summary();
            return 1;
        }
    }

    Properties consumerProperties() {
        Properties p = new Properties();
        p.setProperty(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, options.bootstrapServers);
        p.setProperty(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.setProperty(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.setProperty(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.setProperty(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.setProperty(ConsumerConfig.CLIENT_ID_CONFIG, NAME);
        if (!options.fromBeginning()) {
            p.setProperty(ConsumerConfig.GROUP_ID_CONFIG, options.groupId);
        }
        p.putAll(options.consumerProperties);
        return p;
    }

    int run(KafkaConsumer<byte[], byte[]> consumer) {
        long started = System.nanoTime();
        try {
            List<PartitionInfo> partitions = waitForTopic(consumer);
            if (partitions == null) {
                return 1;
            }
            partitionCount = partitions.size();
            if (options.fromBeginning()) {
                List<TopicPartition> tps = new ArrayList<>();
                for (PartitionInfo pi : partitions) {
                    tps.add(new TopicPartition(pi.topic(), pi.partition()));
                }
                consumer.assign(tps);
                consumer.seekToBeginning(tps);
            } else {
                consumer.subscribe(List.of(options.topic));
            }
            return loop(consumer);
        } catch (WakeupException e) {
            return 0; // SIGINT/SIGTERM
        } finally {
            out.flush();
            summary();
            long ms = (System.nanoTime() - started) / 1_000_000;
            if (options.expect > 0 && distinct < options.expect) {
                err.println(NAME + ": expected " + options.expect + " distinct events, got " + distinct
                        + " (stopped after " + ms + " ms)");
            }
        }
    }

    /** The topic's partitions; waits for the topic to exist (bounded by --max-idle-ms). Null: gave up. */
    private List<PartitionInfo> waitForTopic(KafkaConsumer<byte[], byte[]> consumer) {
        long deadline = options.maxIdleMs > 0 ? System.nanoTime() + options.maxIdleMs * 1_000_000 : Long.MAX_VALUE;
        boolean said = false;
        while (!stopRequested) {
            List<PartitionInfo> infos;
            try {
                infos = consumer.partitionsFor(options.topic, Duration.ofSeconds(10));
            } catch (TimeoutException e) {
                infos = null;
            }
            if (infos != null && !infos.isEmpty()) {
                return infos;
            }
            if (System.nanoTime() >= deadline) {
                err.println(NAME + ": topic " + options.topic + " not found on " + options.bootstrapServers
                        + " within " + options.maxIdleMs + " ms");
                return null;
            }
            if (!said) {
                err.println(NAME + ": waiting for topic " + options.topic + " on " + options.bootstrapServers);
                said = true;
            }
            sleep(500);
        }
        return null;
    }

    private int loop(KafkaConsumer<byte[], byte[]> consumer) {
        long lastActivity = System.nanoTime();
        Map<TopicPartition, OffsetAndMetadata> toCommit = new HashMap<>();
        while (!stopRequested) {
            long pollMs = 1000;
            if (options.maxIdleMs > 0) {
                long left = options.maxIdleMs - (System.nanoTime() - lastActivity) / 1_000_000;
                if (left <= 0) {
                    break;
                }
                pollMs = Math.min(pollMs, left);
            }
            ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(pollMs));
            if (batch.isEmpty()) {
                continue;
            }
            lastActivity = System.nanoTime();
            boolean done = false;
            for (ConsumerRecord<byte[], byte[]> record : batch) {
                if (record.partition() >= partitionCount) {
                    refreshPartitionCount(consumer);
                }
                handle(record);
                toCommit.put(new TopicPartition(record.topic(), record.partition()),
                        new OffsetAndMetadata(record.offset() + 1));
                if (options.expect > 0 && distinct >= options.expect) {
                    done = true;
                    break;
                }
            }
            out.flush();
            if (!options.fromBeginning() && !toCommit.isEmpty()) {
                consumer.commitSync(toCommit); // after processing: at-least-once
                toCommit.clear();
            }
            if (done) {
                break;
            }
        }
        return options.expect > 0 && distinct < options.expect && !stopRequested ? 1 : strictStatus();
    }

    private int strictStatus() {
        return options.strict && (invalid > 0 || misrouted > 0 || conflicting > 0) ? 3 : 0;
    }

    private void refreshPartitionCount(KafkaConsumer<byte[], byte[]> consumer) {
        try {
            List<PartitionInfo> infos = consumer.partitionsFor(options.topic, Duration.ofSeconds(10));
            if (infos != null && !infos.isEmpty()) {
                partitionCount = infos.size();
            }
        } catch (TimeoutException e) {
            // keep the old count
        }
    }

    static Map<String, String> headers(Iterable<Header> headers) {
        Map<String, String> map = new LinkedHashMap<>();
        for (Header h : headers) {
            map.put(h.key(), h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8));
        }
        return map;
    }

    void handle(ConsumerRecord<byte[], byte[]> record) {
        records++;
        Map<String, String> headers = headers(record.headers());
        String key = record.key() == null ? null : new String(record.key(), StandardCharsets.UTF_8);
        Integer expectedPartition = record.key() == null || partitionCount <= 0
                ? null
                : Contract.partitionForKey(record.key(), partitionCount);
        RecordCheck.Result result = RecordCheck.check(key, record.value(), headers);
        String where = record.topic() + "/" + record.partition() + "@" + record.offset();
        if (!result.valid()) {
            invalid++;
            report("invalid record " + where + ": " + String.join("; ", result.problems()));
            return;
        }
        RecordCheck.Event event = result.event();
        if (expectedPartition != null && expectedPartition != record.partition()) {
            misrouted++;
            report("record " + where + " (key " + key + ") belongs on partition " + expectedPartition
                    + " of " + partitionCount + " by murmur2");
        }
        int hash = Arrays.hashCode(record.value());
        Integer first = seen.putIfAbsent(event.eventId(), hash);
        if (first != null) {
            duplicates++;
            if (first != hash) {
                conflicting++;
                report("record " + where + " repeats ce_id " + event.eventId() + " with a different value");
            }
            return;
        }
        distinct++;
        out.println(options.json
                ? jsonLine(event, record, key, expectedPartition, headers)
                : humanLine(event, record));
    }

    private void report(String line) {
        if (reported < MAX_REPORTED) {
            err.println(NAME + ": " + line);
        } else if (reported == MAX_REPORTED) {
            err.println(NAME + ": (further problems are counted, not shown)");
        }
        reported++;
    }

    static String jsonLine(RecordCheck.Event e, ConsumerRecord<byte[], byte[]> record, String key,
                           Integer expectedPartition, Map<String, String> headers) {
        return Json.object()
                .field("event_id", e.eventId())
                .field("booking_id", e.bookingId())
                .field("tenant_id", e.tenantId())
                .field("deal_id", e.dealId())
                .field("property_object_id", e.propertyObjectId())
                .field("phase", e.phaseName())
                .field("expired_at", e.expiredAt().toString())
                .field("correlation_id", e.correlationId())
                .field("contract_version", e.message().getContractVersion())
                .field("aggregate_type", e.message().getAggregateType())
                .field("topic", record.topic())
                .field("partition", record.partition())
                .field("offset", record.offset())
                .field("key", key)
                .field("expected_partition", expectedPartition)
                .field("headers", headers)
                .field("trace", TraceContext.childOf(headers).map(TraceContext::fields).orElse(null))
                .toString();
    }

    static String humanLine(RecordCheck.Event e, ConsumerRecord<byte[], byte[]> record) {
        return "booking " + e.bookingId() + " " + e.phaseName() + " expired at " + e.expiredAt()
                + " (tenant " + e.tenantId() + ", deal " + e.dealId() + ", property object " + e.propertyObjectId()
                + "; event " + e.eventId() + ", correlation " + e.correlationId()
                + "; partition " + record.partition() + " offset " + record.offset() + ")"
                + TraceContext.childOf(headers(record.headers()))
                        .map(t -> "; trace " + t.traceId() + " span " + t.spanId() + " child of " + t.parentSpanId())
                        .orElse("");
    }

    void summary() {
        if (summarized) {
            return;
        }
        summarized = true;
        err.println(NAME + ": records=" + records + " distinct=" + distinct + " duplicates=" + duplicates
                + " invalid=" + invalid + " misrouted=" + misrouted + " conflicting=" + conflicting);
        err.flush();
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
