package pin.crm.consumer;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Timestamp;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.regex.Pattern;
import pin.crm.booking.v1.BookingExpiredEvent;
import pin.crm.booking.v1.Phase;

/**
 * Decodes one record of pin.crm.booking-expired.v1 and checks it against the contract:
 * the headers, the protobuf value and the key.
 */
public final class RecordCheck {
    /** Canonical lowercase hyphenated UUID: the form the key is hashed in, so it must be exact. */
    private static final Pattern CANONICAL_UUID =
            Pattern.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");

    /** A valid event. {@code eventId} is the ce_id header (equal to the payload's event_id). */
    public record Event(
            String eventId,
            String bookingId,
            String tenantId,
            String dealId,
            String propertyObjectId,
            Phase phase,
            Instant expiredAt,
            String correlationId,
            BookingExpiredEvent message) {

        /** {@code RESERVE} or {@code BOOKING}. */
        public String phaseName() {
            return phaseName(phase);
        }

        static String phaseName(Phase phase) {
            String n = phase.name();
            return n.startsWith("PHASE_") ? n.substring("PHASE_".length()) : n;
        }
    }

    /** The outcome: an event (when the value parsed) and the contract violations found (none = valid). */
    public record Result(Event event, List<String> problems) {
        public boolean valid() {
            return problems.isEmpty();
        }
    }

    static boolean isCanonicalUuid(String s) {
        return s != null && CANONICAL_UUID.matcher(s).matches();
    }

    /**
     * @param key the record key as UTF-8 text, or null
     * @param value the record value, or null (a tombstone)
     * @param headers header name to UTF-8 value (the last one of a repeated name)
     */
    public static Result check(String key, byte[] value, Map<String, String> headers) {
        List<String> problems = new ArrayList<>();

        expectHeader(problems, headers, Contract.Headers.TYPE, Contract.EVENT_TYPE);
        expectHeader(problems, headers, Contract.Headers.CONTENT_TYPE, Contract.CONTENT_TYPE);
        expectHeader(problems, headers, Contract.Headers.SPEC_VERSION, Contract.SPEC_VERSION);
        String ceId = uuidHeader(problems, headers, Contract.Headers.ID);
        String correlationId = uuidHeader(problems, headers, Contract.Headers.CORRELATION_ID);
        String tenantHeader = uuidHeader(problems, headers, Contract.Headers.TENANT_ID);
        String source = headers.get(Contract.Headers.SOURCE);
        if (source == null || source.isEmpty()) {
            problems.add("header " + Contract.Headers.SOURCE + " is missing");
        }
        String time = headers.get(Contract.Headers.TIME);
        if (time == null) {
            problems.add("header " + Contract.Headers.TIME + " is missing");
        } else {
            try {
                OffsetDateTime.parse(time);
            } catch (DateTimeParseException e) {
                problems.add("header " + Contract.Headers.TIME + " is not an RFC 3339 time: " + Json.quote(time));
            }
        }

        if (value == null) {
            problems.add("the value is null (a tombstone), not a BookingExpiredEvent");
            return new Result(null, List.copyOf(problems));
        }
        BookingExpiredEvent m;
        try {
            m = BookingExpiredEvent.parseFrom(value);
        } catch (InvalidProtocolBufferException e) {
            problems.add("the value is not a BookingExpiredEvent: " + e.getMessage());
            return new Result(null, List.copyOf(problems));
        }

        uuidField(problems, "booking_id", m.getBookingId());
        uuidField(problems, "tenant_id", m.getTenantId());
        uuidField(problems, "deal_id", m.getDealId());
        uuidField(problems, "property_object_id", m.getPropertyObjectId());
        Phase phase = m.getPhase();
        if (phase != Phase.PHASE_RESERVE && phase != Phase.PHASE_BOOKING) {
            problems.add("phase " + m.getPhaseValue() + " is neither PHASE_RESERVE nor PHASE_BOOKING");
        }
        Instant expiredAt = null;
        if (!m.hasExpiredAt()) {
            problems.add("expired_at is missing");
        } else {
            Timestamp t = m.getExpiredAt();
            if (t.getNanos() < 0 || t.getNanos() > 999_999_999) {
                problems.add("expired_at has nanos out of range: " + t.getNanos());
            } else {
                expiredAt = Instant.ofEpochSecond(t.getSeconds(), t.getNanos());
            }
        }
        if (ceId != null && !ceId.equals(m.getEventId())) {
            problems.add("event_id " + Json.quote(m.getEventId()) + " differs from header ce_id " + ceId);
        }
        if (correlationId != null && !correlationId.equals(m.getCorrelationId())) {
            problems.add("correlation_id " + Json.quote(m.getCorrelationId())
                    + " differs from header correlation_id " + correlationId);
        }
        if (tenantHeader != null && !tenantHeader.equals(m.getTenantId())) {
            problems.add("tenant_id " + Json.quote(m.getTenantId()) + " differs from header tenant_id " + tenantHeader);
        }
        if (m.getContractVersion() != Contract.CONTRACT_VERSION) {
            problems.add("contract_version is " + m.getContractVersion() + ", not " + Contract.CONTRACT_VERSION);
        }
        if (!Contract.AGGREGATE_TYPE.equals(m.getAggregateType())) {
            problems.add("aggregate_type is " + Json.quote(m.getAggregateType()) + ", not " + Contract.AGGREGATE_TYPE);
        }
        if (key == null) {
            problems.add("the record has no key (it must be the booking_id)");
        } else if (!key.equals(m.getBookingId())) {
            problems.add("key " + Json.quote(key) + " differs from booking_id " + Json.quote(m.getBookingId()));
        }

        Event event = new Event(
                ceId != null ? ceId : m.getEventId(),
                m.getBookingId(),
                m.getTenantId(),
                m.getDealId(),
                m.getPropertyObjectId(),
                phase,
                expiredAt,
                correlationId != null ? correlationId : m.getCorrelationId(),
                m);
        return new Result(event, List.copyOf(problems));
    }

    private static void expectHeader(List<String> problems, Map<String, String> headers, String name, String want) {
        String got = headers.get(name);
        if (got == null) {
            problems.add("header " + name + " is missing");
        } else if (!Objects.equals(got, want)) {
            problems.add("header " + name + " is " + Json.quote(got) + ", not " + Json.quote(want));
        }
    }

    private static String uuidHeader(List<String> problems, Map<String, String> headers, String name) {
        String got = headers.get(name);
        if (got == null) {
            problems.add("header " + name + " is missing");
            return null;
        }
        if (!isCanonicalUuid(got)) {
            problems.add("header " + name + " is not a canonical lowercase UUID: " + Json.quote(got));
            return null;
        }
        return got;
    }

    private static void uuidField(List<String> problems, String field, String value) {
        if (value.isEmpty()) {
            problems.add(field + " is empty");
        } else if (!isCanonicalUuid(value)) {
            problems.add(field + " is not a canonical lowercase UUID: " + Json.quote(value));
        }
    }

    private RecordCheck() {}
}
