package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The per-record logic without a broker: dedup by ce_id, invalid and misrouted counts, output lines. */
class ConsumerHandleTest {
    private static final String TOPIC = Contract.TOPIC;

    private final StringWriter out = new StringWriter();
    private final StringWriter err = new StringWriter();

    private BookingExpiredConsumer consumer(boolean json) throws Exception {
        Options o = Options.parse(json ? new String[] {"--bootstrap-servers", "x:1", "--json"}
                : new String[] {"--bootstrap-servers", "x:1"}, Map.of());
        BookingExpiredConsumer c = new BookingExpiredConsumer(o, new PrintWriter(out, true), new PrintWriter(err, true));
        c.partitionCount = 3;
        return c;
    }

    private static int partitionOf(SampleEvents.Sample s) {
        return Contract.partitionForKey(s.keyBytes(), 3);
    }

    @Test
    void duplicatesAreDroppedByCeId() throws Exception {
        BookingExpiredConsumer c = consumer(true);
        List<SampleEvents.Sample> samples = SampleEvents.samples("dedup", 3);
        long offset = 0;
        for (SampleEvents.Sample s : samples) {
            c.handle(s.record(TOPIC, partitionOf(s), offset++));
        }
        // a republish of the first two
        c.handle(samples.get(0).record(TOPIC, partitionOf(samples.get(0)), offset++));
        c.handle(samples.get(1).record(TOPIC, partitionOf(samples.get(1)), offset++));
        assertEquals(5, c.records);
        assertEquals(3, c.distinct);
        assertEquals(2, c.duplicates);
        assertEquals(0, c.invalid);
        assertEquals(0, c.misrouted);
        String[] lines = out.toString().split("\n");
        assertEquals(3, lines.length);
        SampleEvents.Sample s0 = samples.get(0);
        assertTrue(lines[0].startsWith("{\"event_id\":\"" + s0.message().getEventId() + "\",\"booking_id\":\""
                + s0.key() + "\""), lines[0]);
        assertTrue(lines[0].contains("\"phase\":\"RESERVE\""), lines[0]);
        assertTrue(lines[1].contains("\"phase\":\"BOOKING\""), lines[1]);
        assertTrue(lines[0].contains("\"expired_at\":\"2027-01-15T08:00:00.000005Z\""), lines[0]);
        assertTrue(lines[0].contains("\"partition\":" + partitionOf(s0) + ",\"offset\":0,\"key\":\"" + s0.key()
                + "\",\"expected_partition\":" + partitionOf(s0)), lines[0]);
        assertTrue(lines[0].contains("\"headers\":{\"ce_specversion\":\"1.0\",\"ce_id\":\""), lines[0]);
        assertTrue(lines[0].contains("\"content-type\":\"application/protobuf\""), lines[0]);
    }

    @Test
    void aRepeatedCeIdWithOtherBytesIsAConflict() throws Exception {
        BookingExpiredConsumer c = consumer(false);
        SampleEvents.Sample s = SampleEvents.samples("conflict", 1).get(0);
        c.handle(s.record(TOPIC, partitionOf(s), 0));
        SampleEvents.Sample changed = s.withMessage(s.message().toBuilder().setDealId(SampleEvents.uuid("o", "d", 1)).build());
        c.handle(changed.record(TOPIC, partitionOf(s), 1));
        assertEquals(1, c.distinct);
        assertEquals(1, c.duplicates);
        assertEquals(1, c.conflicting);
        assertTrue(err.toString().contains("with a different value"), err.toString());
        assertTrue(out.toString().startsWith("booking " + s.key() + " RESERVE expired at 2027-01-15T08:00:00.000005Z"),
                out.toString());
    }

    @Test
    void invalidAndMisroutedRecordsAreCounted() throws Exception {
        BookingExpiredConsumer c = consumer(true);
        SampleEvents.Sample s = SampleEvents.samples("bad", 1).get(0);
        c.handle(s.withHeader("ce_type", "other").record(TOPIC, partitionOf(s), 0));
        c.handle(s.withHeader("content-type", "application/json").record(TOPIC, partitionOf(s), 1));
        c.handle(s.record(TOPIC, (partitionOf(s) + 1) % 3, 0));
        assertEquals(3, c.records);
        assertEquals(2, c.invalid);
        assertEquals(1, c.misrouted);
        assertEquals(1, c.distinct);
        assertTrue(err.toString().contains("header ce_type is \"other\""), err.toString());
        assertTrue(err.toString().contains("belongs on partition " + partitionOf(s)), err.toString());
        c.summary();
        assertTrue(err.toString().contains("records=3 distinct=1 duplicates=0 invalid=2 misrouted=1"), err.toString());
    }
}
