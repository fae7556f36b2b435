// A plain Java producer (kafka-clients 4.4.0, the client's defaults plus acks=all) as the
// yardstick the cluster fault tests compare the worker with, and a watcher of the cluster's
// leaders and in-sync replicas.
//
//   scripts/kafka.sh plain-producer BOOTSTRAP TOPIC RATE ACKFILE WATCHFILE WATCH_TOPIC...
//   (java -cp "$LIBS/*" scripts/kafka/PlainProducer.java with the same arguments)
//
// Produces RATE records per second (random UUID keys, small values) to TOPIC until SIGTERM;
// the shutdown hook stops sending, closes the producer (up to 10 s for what is in flight)
// and flushes and closes both files.
// - ACKFILE: one line "PARTITION<TAB>EPOCH_MILLIS" per acknowledged record, written in the
//   producer's callback at the moment the acknowledgement arrived (flushed every ~100 ms).
//   Failed records are counted; the first few errors go to stderr.
// - WATCHFILE: every ~100 ms an Admin describeTopics of every WATCH_TOPIC (1 s timeouts, so
//   a dead broker cannot freeze it); whenever a partition's leader or ISR differs from the
//   last observation (the first one too) a line
//   "EPOCH_MILLIS<TAB>TOPIC<TAB>PARTITION<TAB>LEADER<TAB>ISR" (ISR comma-separated, leader
//   -1 when there is none). EPOCH_MILLIS is when the describe request was sent: the state
//   held at the latest then, so a change is never dated later than the poll that saw it
//   started (at most one poll interval plus one round trip after the cluster made it).
// Prints "PlainProducer: N acknowledged, M failed" to stderr at exit.

import java.io.BufferedWriter;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.StringSerializer;

public class PlainProducer {
    static final AtomicBoolean running = new AtomicBoolean(true);

    public static void main(String[] args) throws Exception {
        if (args.length < 6) {
            System.err.println("usage: PlainProducer.java BOOTSTRAP TOPIC RATE ACKFILE WATCHFILE WATCH_TOPIC...");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int rate = Integer.parseInt(args[2]);
        String ackFile = args[3];
        String watchFile = args[4];
        List<String> watched = new ArrayList<>(Arrays.asList(args).subList(5, args.length));

        BufferedWriter acks = new BufferedWriter(new OutputStreamWriter(new FileOutputStream(ackFile), StandardCharsets.UTF_8));
        BufferedWriter watch = new BufferedWriter(new OutputStreamWriter(new FileOutputStream(watchFile), StandardCharsets.UTF_8));
        Object ackLock = new Object();
        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        CountDownLatch finished = new CountDownLatch(1);

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running.set(false);
            try {
                finished.await(20, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));

        Thread watcher = new Thread(() -> watch(bootstrap, watched, watch), "watcher");
        watcher.start();
        Thread flusher = new Thread(() -> {
            while (running.get()) {
                try {
                    Thread.sleep(100);
                } catch (InterruptedException e) {
                    return;
                }
                synchronized (ackLock) {
                    try {
                        acks.flush();
                    } catch (IOException e) {
                        System.err.println("PlainProducer: flush " + ackFile + ": " + e);
                    }
                }
            }
        }, "flusher");
        flusher.setDaemon(true);
        flusher.start();

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "plain-producer");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        try {
            long start = System.nanoTime();
            long sent = 0;
            while (running.get()) {
                long due = start + sent * 1_000_000_000L / rate;
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                    continue;
                }
                String key = UUID.randomUUID().toString();
                producer.send(new ProducerRecord<>(topic, key, "plain-" + sent), (metadata, error) -> {
                    if (error == null) {
                        long now = System.currentTimeMillis();
                        acked.incrementAndGet();
                        synchronized (ackLock) {
                            try {
                                acks.write(metadata.partition() + "\t" + now + "\n");
                            } catch (IOException e) {
                                System.err.println("PlainProducer: write " + ackFile + ": " + e);
                            }
                        }
                    } else if (failed.incrementAndGet() <= 5) {
                        System.err.println("PlainProducer: produce failed: " + error);
                    }
                });
                sent++;
            }
        } finally {
            producer.close(java.time.Duration.ofSeconds(10));
            watcher.interrupt();
            watcher.join(5000);
            synchronized (ackLock) {
                acks.close();
            }
            System.err.println("PlainProducer: " + acked.get() + " acknowledged, " + failed.get() + " failed");
            finished.countDown();
        }
    }

    static void watch(String bootstrap, List<String> topics, BufferedWriter out) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "plain-producer-watcher");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "1000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "1000");
        props.put(AdminClientConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "200");
        Map<String, String> last = new HashMap<>();
        try (Admin admin = Admin.create(props)) {
            while (running.get() && !Thread.currentThread().isInterrupted()) {
                long sentAt = System.currentTimeMillis();
                try {
                    Map<String, TopicDescription> described = admin
                        .describeTopics(topics, new DescribeTopicsOptions().timeoutMs(1000))
                        .allTopicNames()
                        .get(1500, TimeUnit.MILLISECONDS);
                    for (TopicDescription d : described.values()) {
                        for (TopicPartitionInfo p : d.partitions()) {
                            int leader = p.leader() == null || p.leader().isEmpty() ? -1 : p.leader().id();
                            String isr = p.isr().stream().map(Node::id).sorted()
                                .map(String::valueOf).collect(Collectors.joining(","));
                            String key = d.name() + "\t" + p.partition();
                            String state = leader + "\t" + isr;
                            if (!state.equals(last.get(key))) {
                                last.put(key, state);
                                out.write(sentAt + "\t" + key + "\t" + state + "\n");
                            }
                        }
                    }
                    out.flush();
                } catch (InterruptedException e) {
                    break;
                } catch (Exception e) {
                    // a broker down or the metadata unavailable: try again at the next poll
                }
                long wait = sentAt + 100 - System.currentTimeMillis();
                if (wait > 0) {
                    try {
                        Thread.sleep(wait);
                    } catch (InterruptedException e) {
                        break;
                    }
                }
            }
        } finally {
            try {
                out.close();
            } catch (IOException e) {
                System.err.println("PlainProducer: close the watch file: " + e);
            }
        }
    }
}
