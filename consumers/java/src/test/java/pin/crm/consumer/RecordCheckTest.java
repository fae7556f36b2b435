package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.CodedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.time.Instant;
import org.junit.jupiter.api.Test;
import pin.crm.booking.v1.BookingExpiredEvent;
import pin.crm.booking.v1.Phase;

class RecordCheckTest {
    private final SampleEvents.Sample sample = SampleEvents.samples("unit", 1).get(0);

    private RecordCheck.Result check(SampleEvents.Sample s) {
        return RecordCheck.check(s.key(), s.value(), s.headers());
    }

    private static void assertProblem(RecordCheck.Result r, String fragment) {
        assertFalse(r.valid(), "expected a problem containing '" + fragment + "'");
        assertTrue(r.problems().stream().anyMatch(p -> p.contains(fragment)), r.problems().toString());
    }

    @Test
    void aConformingRecordIsValid() {
        RecordCheck.Result r = check(sample);
        assertTrue(r.valid(), r.problems().toString());
        RecordCheck.Event e = r.event();
        assertEquals(sample.key(), e.bookingId());
        assertEquals(sample.headers().get("ce_id"), e.eventId());
        assertEquals("RESERVE", e.phaseName());
        assertEquals(Instant.ofEpochSecond(1_800_000_000L, 5000), e.expiredAt());
        assertEquals("2027-01-15T08:00:00.000005Z", e.expiredAt().toString());
    }

    @Test
    void wrongOrMissingHeadersAreInvalid() {
        assertProblem(check(sample.withHeader("ce_type", "pin.crm.other.v1")), "header ce_type is \"pin.crm.other.v1\"");
        assertProblem(check(sample.withHeader("ce_type", null)), "header ce_type is missing");
        assertProblem(check(sample.withHeader("content-type", "application/json")), "header content-type");
        assertProblem(check(sample.withHeader("ce_specversion", "0.3")), "header ce_specversion");
        assertProblem(check(sample.withHeader("ce_id", null)), "header ce_id is missing");
        assertProblem(check(sample.withHeader("ce_id", "not-a-uuid")), "header ce_id is not a canonical");
        assertProblem(check(sample.withHeader("ce_time", "yesterday")), "ce_time is not an RFC 3339");
        assertProblem(check(sample.withHeader("correlation_id", null)), "header correlation_id is missing");
        assertProblem(check(sample.withHeader("ce_source", null)), "header ce_source is missing");
    }

    @Test
    void headersMustAgreeWithThePayload() {
        String other = SampleEvents.uuid("x", "y", 1);
        assertProblem(check(sample.withHeader("ce_id", other)), "differs from header ce_id");
        assertProblem(check(sample.withHeader("tenant_id", other)), "differs from header tenant_id");
        assertProblem(check(sample.withHeader("correlation_id", other)), "differs from header correlation_id");
    }

    @Test
    void theKeyMustBeTheCanonicalBookingId() {
        assertProblem(check(sample.withKey(sample.key().toUpperCase())), "differs from booking_id");
        assertProblem(check(sample.withKey(null)), "no key");
        BookingExpiredEvent upper = BookingExpiredEvent.newBuilder(sample.message())
                .setBookingId(sample.key().toUpperCase()).build();
        assertProblem(check(sample.withMessage(upper).withKey(upper.getBookingId())), "booking_id is not a canonical");
    }

    @Test
    void payloadRulesAreChecked() {
        BookingExpiredEvent.Builder b = BookingExpiredEvent.newBuilder(sample.message());
        assertProblem(check(sample.withMessage(b.clone().setPhase(Phase.PHASE_UNSPECIFIED).build())), "phase 0");
        assertProblem(check(sample.withMessage(b.clone().setPhaseValue(7).build())), "phase 7");
        assertProblem(check(sample.withMessage(b.clone().clearExpiredAt().build())), "expired_at is missing");
        assertProblem(check(sample.withMessage(b.clone().setDealId("").build())), "deal_id is empty");
        assertProblem(check(sample.withMessage(b.clone().setContractVersion(2).build())), "contract_version is 2");
        assertProblem(check(sample.withMessage(b.clone().setAggregateType("Deal").build())), "aggregate_type");
    }

    @Test
    void garbageAndTombstonesAreInvalid() {
        RecordCheck.Result r = RecordCheck.check(sample.key(), new byte[] {(byte) 0xff, (byte) 0xff, (byte) 0xff},
                sample.headers());
        assertProblem(r, "not a BookingExpiredEvent");
        assertNull(r.event());
        assertProblem(RecordCheck.check(sample.key(), null, sample.headers()), "tombstone");
    }

    /** An additive v1 change (a new field number) must not break this consumer. */
    @Test
    void unknownFieldsOfALaterV1AreIgnored() throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        bytes.write(sample.value());
        CodedOutputStream out = CodedOutputStream.newInstance(bytes);
        out.writeString(99, "a field added later");
        out.writeUInt32(100, 42);
        out.flush();
        RecordCheck.Result r = RecordCheck.check(sample.key(), bytes.toByteArray(), sample.headers());
        assertTrue(r.valid(), r.problems().toString());
        assertEquals(sample.key(), r.event().bookingId());
    }
}
