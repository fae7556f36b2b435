// Dumps a topic with the Java Kafka client (kafka-clients 4.4.0), as an independent
// reader for black-box checks of what another program produced.
//
//   java -cp "$LIBS/*" scripts/kafka/DumpTopic.java BOOTSTRAP TOPIC OUTFILE [MAX_MESSAGES] [IDLE_MS]
//
// No consumer group: assign() on every partition of TOPIC, seek to the beginning, poll.
// Stops when MAX_MESSAGES records were read (0 or absent: no limit), or when no new
// record arrived for IDLE_MS milliseconds (default 5000; counted from the start, then
// from the last record), so an empty topic or a slow producer still ends.
// OUTFILE "-" is stdout. Writes one JSON object per line, in poll order (per partition in
// offset order):
//   {"topic":..,"partition":0,"offset":12,"timestamp":1700000000000,"key":"utf8 or null",
//    "key_b64":"base64 or null","value":"base64 or null","headers":{"name":"utf8 value"}}
// A header name repeated keeps its last value; a null header value is JSON null.
// Environment: KAFKA_DUMP_ISOLATION=read_committed to skip aborted/open transactions
// (default read_uncommitted, the client default).
// Prints "DumpTopic: N records" to stderr; exit 0, 2 on bad usage, 1 on error (e.g. no such topic).

import java.io.BufferedWriter;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class DumpTopic {
    public static void main(String[] args) throws IOException {
        if (args.length < 3 || args.length > 5) {
            System.err.println("usage: DumpTopic.java BOOTSTRAP TOPIC OUTFILE [MAX_MESSAGES] [IDLE_MS]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        String outFile = args[2];
        long max = args.length > 3 ? Long.parseLong(args[3]) : 0;
        long idleMs = args.length > 4 ? Long.parseLong(args[4]) : 5000;
        String isolation = System.getenv().getOrDefault("KAFKA_DUMP_ISOLATION", "read_uncommitted");

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "dump-topic");
        props.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
        props.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");

        long count = 0;
        OutputStream os = outFile.equals("-") ? System.out : new FileOutputStream(outFile);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
             BufferedWriter out = new BufferedWriter(new OutputStreamWriter(os, StandardCharsets.UTF_8))) {
            List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofMillis(15000));
            if (infos == null || infos.isEmpty()) {
                throw new IllegalStateException("topic " + topic + " not found (or has no partitions)");
            }
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : infos) tps.add(new TopicPartition(topic, pi.partition()));
            tps.sort((a, b) -> Integer.compare(a.partition(), b.partition()));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);

            long lastRecord = System.currentTimeMillis();
            outer:
            while (max <= 0 || count < max) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    if (System.currentTimeMillis() - lastRecord >= idleMs) break;
                    continue;
                }
                lastRecord = System.currentTimeMillis();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    out.write(toJson(r));
                    out.write('\n');
                    count++;
                    if (max > 0 && count >= max) break outer;
                }
            }
            out.flush();
        }
        System.err.println("DumpTopic: " + count + " records");
    }

    private static String toJson(ConsumerRecord<byte[], byte[]> r) {
        StringBuilder sb = new StringBuilder(256);
        sb.append("{\"topic\":");
        str(sb, r.topic());
        sb.append(",\"partition\":").append(r.partition());
        sb.append(",\"offset\":").append(r.offset());
        sb.append(",\"timestamp\":").append(r.timestamp());
        sb.append(",\"key\":");
        str(sb, r.key() == null ? null : new String(r.key(), StandardCharsets.UTF_8));
        sb.append(",\"key_b64\":");
        str(sb, r.key() == null ? null : Base64.getEncoder().encodeToString(r.key()));
        sb.append(",\"value\":");
        str(sb, r.value() == null ? null : Base64.getEncoder().encodeToString(r.value()));
        sb.append(",\"headers\":{");
        Map<String, byte[]> headers = new LinkedHashMap<>();
        for (Header h : r.headers()) {
            headers.remove(h.key()); // last one wins, in its own position
            headers.put(h.key(), h.value());
        }
        boolean first = true;
        for (Map.Entry<String, byte[]> e : headers.entrySet()) {
            if (!first) sb.append(',');
            first = false;
            str(sb, e.getKey());
            sb.append(':');
            str(sb, e.getValue() == null ? null : new String(e.getValue(), StandardCharsets.UTF_8));
        }
        sb.append("}}");
        return sb.toString();
    }

    private static void str(StringBuilder sb, String s) {
        if (s == null) {
            sb.append("null");
            return;
        }
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                case '\b': sb.append("\\b"); break;
                case '\f': sb.append("\\f"); break;
                default:
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }
}
