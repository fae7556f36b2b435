package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.junit.jupiter.api.Test;

class OptionsTest {
    private static Options parse(Map<String, String> env, String... args) throws Options.UsageException {
        return Options.parse(args, env);
    }

    @Test
    void defaults() throws Exception {
        Options o = parse(Map.of(), "--bootstrap-servers", "h:1");
        assertEquals("h:1", o.bootstrapServers);
        assertEquals("pin.crm.booking-expired.v1", o.topic);
        assertTrue(o.fromBeginning());
        assertNull(o.groupId);
        assertEquals(-1, o.maxIdleMs);
        assertEquals(-1, o.expect);
        assertFalse(o.json);
        assertFalse(o.strict);
    }

    @Test
    void flagsAndInlineValues() throws Exception {
        Options o = parse(Map.of(), "--bootstrap-servers=h:1,h:2", "--topic", "t", "--group-id=g", "--max-idle-ms",
                "5000", "--expect=7", "--json", "--strict", "--consumer-property", "fetch.min.bytes=1");
        assertEquals("h:1,h:2", o.bootstrapServers);
        assertEquals("t", o.topic);
        assertEquals("g", o.groupId);
        assertFalse(o.fromBeginning());
        assertEquals(5000, o.maxIdleMs);
        assertEquals(7, o.expect);
        assertTrue(o.json);
        assertTrue(o.strict);
        assertEquals("1", o.consumerProperties.getProperty("fetch.min.bytes"));
    }

    @Test
    void environmentIsTheFallbackAndFlagsWin() throws Exception {
        Map<String, String> env = Map.of("KAFKA_BOOTSTRAP_SERVERS", "env:1", "KAFKA_TOPIC", "envtopic",
                "KAFKA_GROUP_ID", "envgroup", "CONSUMER_MAX_IDLE_MS", "100", "CONSUMER_EXPECT", "3",
                "CONSUMER_JSON", "1");
        Options o = parse(env);
        assertEquals("env:1", o.bootstrapServers);
        assertEquals("envtopic", o.topic);
        assertEquals("envgroup", o.groupId);
        assertEquals(100, o.maxIdleMs);
        assertEquals(3, o.expect);
        assertTrue(o.json);
        Options f = parse(env, "--bootstrap-servers", "flag:1", "--from-beginning", "--json=false");
        assertEquals("flag:1", f.bootstrapServers);
        assertTrue(f.fromBeginning());
        assertFalse(f.json);
    }

    @Test
    void badUsage() {
        assertThrows(Options.UsageException.class, () -> parse(Map.of()));
        assertThrows(Options.UsageException.class, () -> parse(Map.of(), "--bootstrap-servers"));
        assertThrows(Options.UsageException.class, () -> parse(Map.of(), "--bootstrap-servers", "h:1", "--expect", "0"));
        assertThrows(Options.UsageException.class, () -> parse(Map.of(), "--bootstrap-servers", "h:1", "--max-idle-ms", "x"));
        assertThrows(Options.UsageException.class, () -> parse(Map.of(), "--bootstrap-servers", "h:1", "--bogus"));
        assertThrows(Options.UsageException.class,
                () -> parse(Map.of(), "--bootstrap-servers", "h:1", "--from-beginning", "--group-id", "g"));
        assertThrows(Options.UsageException.class,
                () -> parse(Map.of(), "--bootstrap-servers", "h:1", "--consumer-property", "novalue"));
    }

    @Test
    void helpNeedsNoBroker() throws Exception {
        assertTrue(parse(Map.of(), "--help").help);
    }
}
