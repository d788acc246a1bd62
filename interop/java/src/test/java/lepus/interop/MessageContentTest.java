package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import java.io.IOException;
import java.math.BigDecimal;
import java.util.Date;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** Content frames: bodies (empty, binary, 1 MiB), every BasicProperties field, every header value type. */
class MessageContentTest extends BrokerTest {

    private GetResponse roundTrip(AMQP.BasicProperties props, byte[] body) throws Exception {
        String q = declareQueue("content");
        ch.basicPublish("", q, props, body);
        return Broker.getWithin(ch, q, true);
    }

    @Test
    void oneMebibyteMessageRoundTrips() throws Exception {
        byte[] body = new byte[1024 * 1024];
        new Random(42).nextBytes(body);
        String q = declareQueue("large");
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q, true);
        ch.basicPublish("", q, null, body);
        assertArrayEquals(body, inbox.next().getBody());
        assertArrayEquals(body, roundTrip(null, body).getBody(), "also through basic.get");
    }

    @Test
    void emptyBodyRoundTrips() throws Exception {
        GetResponse r = roundTrip(new AMQP.BasicProperties.Builder().type("empty").build(), new byte[0]);
        assertEquals(0, r.getBody().length);
        assertEquals("empty", r.getProps().getType());
    }

    @Test
    void everyByteValueRoundTrips() throws Exception {
        byte[] body = new byte[256 * 4];
        for (int i = 0; i < body.length; i++) {
            body[i] = (byte) i;
        }
        assertArrayEquals(body, roundTrip(null, body).getBody());
    }

    @Test
    void messageWithoutPropertiesHasNoneSet() throws Exception {
        AMQP.BasicProperties p = roundTrip(null, Broker.bytes("bare")).getProps();
        assertNull(p.getContentType());
        assertNull(p.getHeaders());
        assertNull(p.getDeliveryMode());
        assertNull(p.getPriority());
        assertNull(p.getMessageId());
        assertNull(p.getTimestamp());
    }

    @Test
    void allBasicPropertiesRoundTrip() throws Exception {
        Date timestamp = new Date(1_700_000_000_000L); // whole seconds: AMQP timestamps have 1 s resolution
        AMQP.BasicProperties sent = new AMQP.BasicProperties.Builder()
                .contentType("application/json")
                .contentEncoding("gzip")
                .headers(Map.of("h", "v"))
                .deliveryMode(2)
                .priority(7)
                .correlationId("corr-1")
                .replyTo("reply-queue")
                .expiration("60000")
                .messageId("msg-1")
                .timestamp(timestamp)
                .type("order.created")
                .userId(Broker.URL.user())
                .appId("lepus-interop")
                .clusterId("cluster-1")
                .build();
        AMQP.BasicProperties p = roundTrip(sent, Broker.bytes("{}")).getProps();
        assertEquals("application/json", p.getContentType());
        assertEquals("gzip", p.getContentEncoding());
        assertEquals("v", p.getHeaders().get("h").toString());
        assertEquals(2, p.getDeliveryMode());
        assertEquals(7, p.getPriority());
        assertEquals("corr-1", p.getCorrelationId());
        assertEquals("reply-queue", p.getReplyTo());
        assertEquals("60000", p.getExpiration());
        assertEquals("msg-1", p.getMessageId());
        assertEquals(timestamp, p.getTimestamp());
        assertEquals("order.created", p.getType());
        assertEquals(Broker.URL.user(), p.getUserId());
        assertEquals("lepus-interop", p.getAppId());
        assertEquals("cluster-1", p.getClusterId());
    }

    @Test
    void publishingWithSomeoneElsesUserIdClosesChannelWith406() throws Exception {
        String q = declareQueue("user-id");
        java.util.concurrent.CompletableFuture<com.rabbitmq.client.ShutdownSignalException> shutdown =
                new java.util.concurrent.CompletableFuture<>();
        ch.addShutdownListener(shutdown::complete);
        ch.basicPublish("", q, new AMQP.BasicProperties.Builder().userId("not-" + Broker.URL.user()).build(),
                Broker.bytes("forged"));
        com.rabbitmq.client.ShutdownSignalException sse = shutdown.get(Broker.TIMEOUT_MS, java.util.concurrent.TimeUnit.MILLISECONDS);
        assertTrue(!sse.isHardError());
        assertEquals(406, Broker.replyCode(sse));
        assertTrue(Broker.replyText(sse).startsWith("PRECONDITION_FAILED"), Broker.replyText(sse));
        assertThrows(IOException.class, () -> conn.createChannel().queueDeclarePassive(q + "-missing"));
    }

    @Test
    void everyHeaderValueTypeTheJavaClientWritesRoundTrips() throws Exception {
        Map<String, Object> nested = new HashMap<>();
        nested.put("inner-string", "deep");
        nested.put("inner-int", 7);
        nested.put("inner-map", Map.of("deeper", true));
        Date date = new Date(1_600_000_000_000L);
        Map<String, Object> h = new HashMap<>();
        h.put("string", "héllo wörld");
        h.put("int", Integer.MIN_VALUE);
        h.put("long", Long.MAX_VALUE);
        h.put("short", (short) -12345);
        h.put("byte", (byte) -7);
        h.put("bool-true", true);
        h.put("bool-false", false);
        h.put("double", 3.141592653589793);
        h.put("float", 2.5f);
        h.put("decimal", new BigDecimal("1234.56"));
        h.put("date", date);
        h.put("bytes", new byte[] {0, 1, 2, (byte) 0xff});
        h.put("list", List.of("a", 1, true, List.of(2L)));
        h.put("map", nested);
        h.put("null", null);

        Map<String, Object> got = roundTrip(new AMQP.BasicProperties.Builder().headers(h).build(), Broker.bytes("h"))
                .getProps().getHeaders();

        assertEquals(h.keySet(), got.keySet());
        assertInstanceOf(LongString.class, got.get("string"));
        assertEquals("héllo wörld", got.get("string").toString());
        assertEquals(Integer.MIN_VALUE, got.get("int"));
        assertEquals(Long.MAX_VALUE, got.get("long"));
        assertEquals((short) -12345, got.get("short"));
        assertEquals((byte) -7, got.get("byte"));
        assertEquals(true, got.get("bool-true"));
        assertEquals(false, got.get("bool-false"));
        assertEquals(3.141592653589793, got.get("double"));
        assertEquals(2.5f, got.get("float"));
        assertEquals(new BigDecimal("1234.56"), got.get("decimal"));
        assertEquals(date, got.get("date"));
        assertArrayEquals(new byte[] {0, 1, 2, (byte) 0xff}, (byte[]) got.get("bytes"));
        List<?> list = (List<?>) got.get("list");
        assertEquals(4, list.size());
        assertEquals("a", list.get(0).toString());
        assertEquals(1, list.get(1));
        assertEquals(true, list.get(2));
        assertEquals(List.of(2L), list.get(3));
        @SuppressWarnings("unchecked")
        Map<String, Object> m = (Map<String, Object>) got.get("map");
        assertEquals("deep", m.get("inner-string").toString());
        assertEquals(7, m.get("inner-int"));
        assertEquals(Map.of("deeper", true), m.get("inner-map"));
        assertTrue(got.containsKey("null"));
        assertNull(got.get("null"));
    }
}
