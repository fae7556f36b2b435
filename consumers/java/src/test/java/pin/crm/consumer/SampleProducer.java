package pin.crm.consumer;

import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import pin.crm.booking.v1.BookingExpiredEvent;

/**
 * A throwaway test producer (test scope, not in the fat jar): writes contract-conforming sample
 * BookingExpiredEvent records, keyed by booking id and partitioned by the Java default partitioner,
 * plus optional republished duplicates, invalid records and records on the wrong partition.
 *
 * <pre>
 * java -cp consumers/java/target/test-classes:consumers/java/target/booking-expired-consumer.jar \
 *   pin.crm.consumer.SampleProducer --bootstrap-servers 127.0.0.1:9092 --count 6 --duplicates 2 \
 *   [--topic T] [--invalid K] [--misrouted M] [--seed S] [--expected-out FILE]
 * </pre>
 *
 * Prints one JSON line per distinct valid event sent (event_id, booking_id, phase, expired_at,
 * partition) to --expected-out (or stdout), and a summary on stderr.
 */
public final class SampleProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = System.getenv("KAFKA_BOOTSTRAP_SERVERS");
        String topic = Contract.TOPIC;
        int count = 5;
        int duplicates = 0;
        int invalid = 0;
        int misrouted = 0;
        String seed = Long.toHexString(System.nanoTime());
        Path expectedOut = null;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            String v = i + 1 < args.length ? args[i + 1] : null;
            switch (a) {
                case "--bootstrap-servers" -> { bootstrap = v; i++; }
                case "--topic" -> { topic = v; i++; }
                case "--count" -> { count = Integer.parseInt(v); i++; }
                case "--duplicates" -> { duplicates = Integer.parseInt(v); i++; }
                case "--invalid" -> { invalid = Integer.parseInt(v); i++; }
                case "--misrouted" -> { misrouted = Integer.parseInt(v); i++; }
                case "--seed" -> { seed = v; i++; }
                case "--expected-out" -> { expectedOut = Path.of(v); i++; }
                default -> {
                    System.err.println("SampleProducer: unknown argument " + a);
                    System.exit(2);
                }
            }
        }
        if (bootstrap == null || duplicates > count || misrouted > count) {
            System.err.println("SampleProducer: --bootstrap-servers needed; --duplicates and --misrouted <= --count");
            System.exit(2);
        }
        System.exit(produce(bootstrap, topic, count, duplicates, invalid, misrouted, seed, expectedOut));
    }

    static int produce(String bootstrap, String topic, int count, int duplicates, int invalid, int misrouted,
                       String seed, Path expectedOut) throws IOException, InterruptedException, ExecutionException {
        Properties p = new Properties();
        p.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.setProperty(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.setProperty(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        p.setProperty(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "booking-expired-sample-producer");

        List<SampleEvents.Sample> samples = SampleEvents.samples(seed, count);
        List<String> expected = new ArrayList<>();
        int sent = 0;
        int disagreements = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            int partitions = producer.partitionsFor(topic).size();
            for (int i = 0; i < samples.size(); i++) {
                SampleEvents.Sample s = samples.get(i);
                int want = Contract.partitionForKey(s.keyBytes(), partitions);
                // the last --misrouted samples go to a partition the key does not hash to
                Integer forced = i >= samples.size() - misrouted && partitions > 1 ? (want + 1) % partitions : null;
                RecordMetadata md = send(producer, topic, forced, s.keyBytes(), s.value(), s.headers());
                sent++;
                if (forced == null && md.partition() != want) {
                    System.err.println("SampleProducer: the producer put key " + s.key() + " on partition "
                            + md.partition() + ", Contract.partitionForKey says " + want);
                    disagreements++;
                }
                expected.add(Json.object()
                        .field("event_id", s.message().getEventId())
                        .field("booking_id", s.key())
                        .field("phase", RecordCheck.Event.phaseName(s.message().getPhase()))
                        .field("expired_at", s.expiredAt().toString())
                        .field("partition", md.partition())
                        .field("expected_partition", want)
                        .toString());
            }
            // republishes: identical key, value and headers (same ce_id), as after a crash of the outbox
            for (int i = 0; i < duplicates; i++) {
                SampleEvents.Sample s = samples.get(i);
                send(producer, topic, null, s.keyBytes(), s.value(), s.headers());
                sent++;
            }
            // invalid records, one kind each in turn
            for (int i = 0; i < invalid; i++) {
                SampleEvents.Sample s = SampleEvents.sample(seed + "-invalid", i, SampleEvents.uuid(seed, "run", 1));
                switch (i % 4) {
                    case 0 -> s = s.withHeader(Contract.Headers.TYPE, "pin.crm.something-else.v1");
                    case 1 -> s = s.withHeader(Contract.Headers.CONTENT_TYPE, "application/json");
                    case 2 -> s = s.withHeader(Contract.Headers.ID, null);
                    default -> s = s.withMessage(BookingExpiredEvent.newBuilder(s.message())
                            .setBookingId(s.key().toUpperCase()).build());
                }
                byte[] value = i % 4 == 3 && i % 8 == 7
                        ? "not protobuf".getBytes(StandardCharsets.UTF_8)
                        : s.value();
                send(producer, topic, null, s.keyBytes(), value, s.headers());
                sent++;
            }
            producer.flush();
        }
        try (PrintWriter w = expectedOut == null
                ? new PrintWriter(System.out, false, StandardCharsets.UTF_8)
                : new PrintWriter(Files.newBufferedWriter(expectedOut, StandardCharsets.UTF_8))) {
            expected.forEach(w::println);
        }
        System.err.println("SampleProducer: sent " + sent + " records to " + topic + " (" + count + " distinct, "
                + duplicates + " duplicates, " + invalid + " invalid, " + misrouted + " misrouted; seed " + seed + ")");
        return disagreements == 0 ? 0 : 1;
    }

    private static RecordMetadata send(KafkaProducer<byte[], byte[]> producer, String topic, Integer partition,
                                       byte[] key, byte[] value, Map<String, String> headers)
            throws InterruptedException, ExecutionException {
        RecordHeaders rh = new RecordHeaders();
        headers.forEach((k, v) -> rh.add(k, v.getBytes(StandardCharsets.UTF_8)));
        return producer.send(new ProducerRecord<>(topic, partition, key, value, rh)).get();
    }

    private SampleProducer() {}
}
