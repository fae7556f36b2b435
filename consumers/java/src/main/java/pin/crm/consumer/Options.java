package pin.crm.consumer;

import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;

/** Command-line flags, each with an environment variable fallback (a flag wins). */
public final class Options {
    static final String USAGE = """
            usage: booking-expired-consumer --bootstrap-servers HOST:PORT[,...] [options]

            Reads pin.crm.booking-expired.v1 (protobuf BookingExpiredEvent), checks every record
            against the contract, drops duplicates by ce_id and prints one line per distinct event
            on stdout. A summary (records, distinct, duplicates, invalid, misrouted) goes to stderr
            at the end.

              --bootstrap-servers LIST  Kafka brokers                       env KAFKA_BOOTSTRAP_SERVERS
              --topic NAME              default pin.crm.booking-expired.v1  env KAFKA_TOPIC
              --from-beginning          (default) assign() every partition and read it from the
                                        start, without a consumer group; commits nothing
              --group-id ID             instead join consumer group ID (subscribe, start at the
                                        earliest offset when the group has none, commit after
                                        processing: at-least-once)       env KAFKA_GROUP_ID
              --max-idle-ms N           stop after N ms without a record  env CONSUMER_MAX_IDLE_MS
                                        (default: run until SIGINT/SIGTERM)
              --expect N                stop after N distinct events      env CONSUMER_EXPECT
                                        (exit 1 if it stops idle before)
              --json                    one JSON object per distinct event  env CONSUMER_JSON=1
              --strict                  exit 3 if a record was invalid or on the wrong partition,
                                        or a ce_id came back with other bytes  env CONSUMER_STRICT=1
              --consumer-config FILE    extra Kafka consumer properties (security.protocol, sasl.*...)
              --consumer-property K=V   one extra Kafka consumer property (repeatable)
              -h, --help                this text

            exit status: 0 done; 1 --expect not reached or topic missing; 2 bad usage; 3 --strict failed
            """;

    String bootstrapServers;
    String topic = Contract.TOPIC;
    String groupId;
    long maxIdleMs = -1;
    long expect = -1;
    boolean json;
    boolean strict;
    boolean help;
    final Properties consumerProperties = new Properties();

    /** Bad usage: exit status 2. */
    public static final class UsageException extends Exception {
        UsageException(String message) {
            super(message);
        }
    }

    boolean fromBeginning() {
        return groupId == null;
    }

    static Options parse(String[] args, Map<String, String> env) throws UsageException {
        Options o = new Options();
        o.bootstrapServers = nonEmpty(env.get("KAFKA_BOOTSTRAP_SERVERS"));
        String t = nonEmpty(env.get("KAFKA_TOPIC"));
        if (t != null) {
            o.topic = t;
        }
        o.groupId = nonEmpty(env.get("KAFKA_GROUP_ID"));
        String idle = nonEmpty(env.get("CONSUMER_MAX_IDLE_MS"));
        if (idle != null) {
            o.maxIdleMs = positive("CONSUMER_MAX_IDLE_MS", idle);
        }
        String expect = nonEmpty(env.get("CONSUMER_EXPECT"));
        if (expect != null) {
            o.expect = positive("CONSUMER_EXPECT", expect);
        }
        o.json = truthy(env.get("CONSUMER_JSON"));
        o.strict = truthy(env.get("CONSUMER_STRICT"));

        boolean fromBeginningFlag = false;
        boolean groupFlag = false;
        for (int i = 0; i < args.length; i++) {
            String arg = args[i];
            String name = arg;
            String inline = null;
            int eq = arg.indexOf('=');
            if (arg.startsWith("--") && eq > 0) {
                name = arg.substring(0, eq);
                inline = arg.substring(eq + 1);
            }
            String v = null;
            if (isValueOption(name)) {
                if (inline != null) {
                    v = inline;
                } else if (i + 1 < args.length) {
                    v = args[++i];
                } else {
                    throw new UsageException(name + " needs a value");
                }
            }
            switch (name) {
                case "-h", "--help" -> o.help = true;
                case "--json" -> o.json = flag(name, inline);
                case "--strict" -> o.strict = flag(name, inline);
                case "--from-beginning" -> {
                    if (flag(name, inline)) {
                        fromBeginningFlag = true;
                        o.groupId = null;
                    }
                }
                case "--bootstrap-servers" -> o.bootstrapServers = required(name, v);
                case "--topic" -> o.topic = required(name, v);
                case "--group-id" -> {
                    o.groupId = required(name, v);
                    groupFlag = true;
                }
                case "--max-idle-ms" -> o.maxIdleMs = positive(name, v);
                case "--expect" -> o.expect = positive(name, v);
                case "--consumer-config" -> o.load(Path.of(v));
                case "--consumer-property" -> {
                    int at = v.indexOf('=');
                    if (at <= 0) {
                        throw new UsageException(name + " wants KEY=VALUE, got '" + v + "'");
                    }
                    o.consumerProperties.setProperty(v.substring(0, at).trim(), v.substring(at + 1));
                }
                default -> throw new UsageException("unknown argument '" + arg + "'");
            }
        }
        if (fromBeginningFlag && groupFlag) {
            throw new UsageException("--from-beginning and --group-id exclude each other");
        }
        if (!o.help && o.bootstrapServers == null) {
            throw new UsageException("--bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS) is required");
        }
        return o;
    }

    private static boolean isValueOption(String name) {
        return switch (name) {
            case "--bootstrap-servers", "--topic", "--group-id", "--max-idle-ms", "--expect",
                    "--consumer-config", "--consumer-property" -> true;
            default -> false;
        };
    }

    private static boolean flag(String name, String inline) throws UsageException {
        if (inline == null) {
            return true;
        }
        if (truthy(inline)) {
            return true;
        }
        if (falsy(inline)) {
            return false;
        }
        throw new UsageException(name + " is a flag; '" + inline + "' is neither true nor false");
    }

    private static String required(String name, String v) throws UsageException {
        if (v.isBlank()) {
            throw new UsageException(name + " must not be empty");
        }
        return v;
    }

    private static long positive(String name, String v) throws UsageException {
        try {
            long n = Long.parseLong(v.trim());
            if (n <= 0) {
                throw new UsageException(name + " must be a positive integer, got '" + v + "'");
            }
            return n;
        } catch (NumberFormatException e) {
            throw new UsageException(name + " must be a positive integer, got '" + v + "'");
        }
    }

    private static String nonEmpty(String v) {
        return v == null || v.isBlank() ? null : v;
    }

    private static boolean truthy(String v) {
        return v != null && switch (v.trim().toLowerCase(Locale.ROOT)) {
            case "1", "true", "yes", "on" -> true;
            default -> false;
        };
    }

    private static boolean falsy(String v) {
        return v != null && switch (v.trim().toLowerCase(Locale.ROOT)) {
            case "0", "false", "no", "off" -> true;
            default -> false;
        };
    }

    private void load(Path file) throws UsageException {
        try (Reader r = Files.newBufferedReader(file, StandardCharsets.UTF_8)) {
            consumerProperties.load(r);
        } catch (IOException e) {
            throw new UsageException("cannot read --consumer-config " + file + ": " + e.getMessage());
        }
    }
}
