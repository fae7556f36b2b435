// The partition the Java Kafka client (kafka-clients 4.4.0) picks for a record key,
// computed by the client's own code, for black-box checks of another implementation.
//
//   java -cp "$LIBS/*" scripts/kafka/Partition.java [--murmur2] --partitions N [KEY...]
//
// Prints one line per key: KEY<TAB>PARTITION (with --murmur2: KEY<TAB>PARTITION<TAB>MURMUR2,
// the signed 32-bit Utils.murmur2 of the key's UTF-8 bytes). With no KEY arguments the
// keys are read from stdin, one per line (the line exactly, without its '\n'), so
// thousands of keys cost one JVM start. "--" ends the options (for keys that start "--").
//
// PARTITION is BuiltInPartitioner.partitionForKey, i.e. what KafkaProducer's default
// partitioning does for a non-null key:
//   Utils.toPositive(Utils.murmur2(key.getBytes(UTF_8))) % N
// Both are evaluated and must agree.

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.utils.Utils;

public class Partition {
    public static void main(String[] args) throws IOException {
        int partitions = -1;
        boolean raw = false;
        List<String> keys = new ArrayList<>();
        boolean options = true;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (options && a.equals("--")) {
                options = false;
            } else if (options && a.equals("--partitions")) {
                if (i + 1 >= args.length) usage("--partitions needs a value");
                partitions = parsePartitions(args[++i]);
            } else if (options && a.startsWith("--partitions=")) {
                partitions = parsePartitions(a.substring("--partitions=".length()));
            } else if (options && a.equals("--murmur2")) {
                raw = true;
            } else if (options && (a.equals("-h") || a.equals("--help"))) {
                usage(null);
            } else if (options && a.startsWith("--")) {
                usage("unknown option " + a);
            } else {
                keys.add(a);
            }
        }
        if (partitions < 0) usage("--partitions N is required");

        BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16);
        if (!keys.isEmpty()) {
            for (String k : keys) emit(out, k, partitions, raw);
        } else {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8), 1 << 16);
            String line;
            while ((line = in.readLine()) != null) emit(out, line, partitions, raw);
        }
        out.flush();
    }

    private static void emit(BufferedWriter out, String key, int partitions, boolean raw) throws IOException {
        byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
        int hash = Utils.murmur2(bytes);
        int p = Utils.toPositive(hash) % partitions;
        int q = BuiltInPartitioner.partitionForKey(bytes, partitions);
        if (p != q) {
            throw new IllegalStateException("kafka-clients disagrees with itself for key " + key + ": " + p + " vs " + q);
        }
        out.write(key);
        out.write('\t');
        out.write(Integer.toString(p));
        if (raw) {
            out.write('\t');
            out.write(Integer.toString(hash));
        }
        out.write('\n');
    }

    private static int parsePartitions(String s) {
        try {
            int n = Integer.parseInt(s);
            if (n > 0) return n;
        } catch (NumberFormatException e) {
            // fall through
        }
        usage("--partitions must be a positive integer, got " + s);
        return -1;
    }

    private static void usage(String error) {
        String text = "usage: Partition.java [--murmur2] --partitions N [--] [KEY...]   (keys from stdin when none given)";
        if (error == null) {
            System.out.println(text);
            System.exit(0);
        }
        System.err.println("Partition.java: " + error);
        System.err.println(text);
        System.exit(2);
    }
}
