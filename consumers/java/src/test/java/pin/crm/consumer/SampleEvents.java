package pin.crm.consumer;

import com.google.protobuf.Timestamp;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import pin.crm.booking.v1.BookingExpiredEvent;
import pin.crm.booking.v1.Phase;

/** Contract-conforming sample events, as the booking-expiration worker writes them. */
final class SampleEvents {
    static final String SOURCE = "/pin/crm/booking-expiration";
    /** RFC 3339 with microseconds and Z, like the worker's ce_time. */
    static final DateTimeFormatter CE_TIME =
            DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS'Z'").withZone(ZoneOffset.UTC);

    /** One sample: the parsed fields plus the bytes and headers a record carries. */
    record Sample(String key, BookingExpiredEvent message, Map<String, String> headers) {
        byte[] keyBytes() {
            return key.getBytes(StandardCharsets.UTF_8);
        }

        byte[] value() {
            return message.toByteArray();
        }

        Instant expiredAt() {
            return Instant.ofEpochSecond(message.getExpiredAt().getSeconds(), message.getExpiredAt().getNanos());
        }

        Sample withHeader(String name, String value) {
            Map<String, String> h = new LinkedHashMap<>(headers);
            if (value == null) {
                h.remove(name);
            } else {
                h.put(name, value);
            }
            return new Sample(key, message, h);
        }

        Sample withMessage(BookingExpiredEvent m) {
            return new Sample(key, m, headers);
        }

        Sample withKey(String k) {
            return new Sample(k, message, headers);
        }

        ConsumerRecord<byte[], byte[]> record(String topic, int partition, long offset) {
            return record(topic, partition, offset, value());
        }

        ConsumerRecord<byte[], byte[]> record(String topic, int partition, long offset, byte[] value) {
            RecordHeaders rh = new RecordHeaders();
            headers.forEach((k, v) -> rh.add(k, v == null ? null : v.getBytes(StandardCharsets.UTF_8)));
            return new ConsumerRecord<>(topic, partition, offset, 0L,
                    org.apache.kafka.common.record.TimestampType.CREATE_TIME, -1, -1,
                    key == null ? null : keyBytes(), value, rh, java.util.Optional.empty());
        }
    }

    static String uuid(String seed, String what, long i) {
        return UUID.nameUUIDFromBytes((seed + "/" + what + "/" + i).getBytes(StandardCharsets.UTF_8)).toString();
    }

    /** The i-th sample of a run named {@code seed}; phase alternates, two tenants. */
    static Sample sample(String seed, long i, String correlationId) {
        String bookingId = uuid(seed, "booking", i);
        String eventId = uuid(seed, "event", i);
        String tenantId = uuid(seed, "tenant", i % 2);
        // 2027-01-15T08:00:00Z plus i minutes, with microseconds like Postgres timestamptz
        Instant at = Instant.ofEpochSecond(1_800_000_000L + 60 * i, (i % 1000) * 1000 + 5000);
        BookingExpiredEvent m = BookingExpiredEvent.newBuilder()
                .setBookingId(bookingId)
                .setTenantId(tenantId)
                .setDealId(uuid(seed, "deal", i))
                .setPropertyObjectId(uuid(seed, "object", i))
                .setPhase(i % 2 == 0 ? Phase.PHASE_RESERVE : Phase.PHASE_BOOKING)
                .setExpiredAt(Timestamp.newBuilder().setSeconds(at.getEpochSecond()).setNanos(at.getNano()))
                .setEventId(eventId)
                .setCorrelationId(correlationId)
                .setContractVersion(Contract.CONTRACT_VERSION)
                .setAggregateType(Contract.AGGREGATE_TYPE)
                .build();
        Map<String, String> h = new LinkedHashMap<>();
        h.put(Contract.Headers.SPEC_VERSION, Contract.SPEC_VERSION);
        h.put(Contract.Headers.ID, eventId);
        h.put(Contract.Headers.SOURCE, SOURCE);
        h.put(Contract.Headers.TYPE, Contract.EVENT_TYPE);
        h.put(Contract.Headers.TIME, CE_TIME.format(at));
        h.put(Contract.Headers.CONTENT_TYPE, Contract.CONTENT_TYPE);
        h.put(Contract.Headers.CORRELATION_ID, correlationId);
        h.put(Contract.Headers.TENANT_ID, tenantId);
        return new Sample(bookingId, m, h);
    }

    static List<Sample> samples(String seed, int n) {
        String correlationId = uuid(seed, "run", 0);
        List<Sample> list = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            list.add(sample(seed, i, correlationId));
        }
        return list;
    }

    private SampleEvents() {}
}
