package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BuiltinExchangeType;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.GetResponse;
import java.io.IOException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** exchange.* : declare flags, predeclared exchanges, types, exchange-to-exchange bindings, alternate exchange. */
class ExchangeTest extends BrokerTest {

    private static AMQP.BasicProperties headers(Map<String, Object> h) {
        return new AMQP.BasicProperties.Builder().headers(h).build();
    }

    /** Publishes one message per header map and returns the bodies that reached {@code q}, in order. */
    private List<String> routedBodies(String x, String q, List<Map<String, Object>> messages) throws Exception {
        for (int i = 0; i < messages.size(); i++) {
            ch.basicPublish(x, "ignored", headers(messages.get(i)), Broker.bytes("m" + i));
        }
        // a marker that always matches (binding below) tells us all earlier messages were routed
        ch.basicPublish("", q, null, Broker.bytes("end"));
        java.util.ArrayList<String> bodies = new java.util.ArrayList<>();
        while (true) {
            String b = Broker.body(Broker.getWithin(ch, q, true));
            if (b.equals("end")) {
                return bodies;
            }
            bodies.add(b);
        }
    }

    @Test
    void predeclaredExchangesExist() throws Exception {
        for (String x : List.of("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match")) {
            assertTrue(ch.exchangeDeclarePassive(x) instanceof AMQP.Exchange.DeclareOk, x);
        }
    }

    @Test
    void defaultExchangeRoutesByQueueName() throws Exception {
        String q = declareQueue("default-x");
        ch.basicPublish("", q, null, Broker.bytes("direct to queue"));
        GetResponse r = Broker.getWithin(ch, q, true);
        assertEquals("direct to queue", Broker.body(r));
        assertEquals("", r.getEnvelope().getExchange());
        assertEquals(q, r.getEnvelope().getRoutingKey());
    }

    @Test
    void amqDirectAndAmqTopicRouteToBoundQueues() throws Exception {
        String q = declareQueue("amq-x");
        ch.queueBind(q, "amq.direct", q);
        ch.queueBind(q, "amq.topic", q + ".#");
        ch.basicPublish("amq.direct", q, null, Broker.bytes("via amq.direct"));
        ch.basicPublish("amq.topic", q + ".a.b", null, Broker.bytes("via amq.topic"));
        assertEquals("via amq.direct", Broker.body(Broker.getWithin(ch, q, true)));
        assertEquals("via amq.topic", Broker.body(Broker.getWithin(ch, q, true)));
    }

    @Test
    void passiveDeclareOfExistingExchangeSucceedsWhateverTheOtherFlags() throws Exception {
        String x = exchangeName("passive");
        ch.exchangeDeclare(x, BuiltinExchangeType.TOPIC, true);
        ch.exchangeDeclarePassive(x);
        assertTrue(ch.isOpen());
    }

    @Test
    void redeclaringExchangeWithSameAttributesIsIdempotent() throws Exception {
        String x = exchangeName("same");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS, false, true, null);
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS, false, true, null);
        assertTrue(ch.isOpen());
    }

    @Test
    void deletedExchangeIsGone() throws Exception {
        String x = exchangeName("deleted");
        ch.exchangeDeclare(x, BuiltinExchangeType.DIRECT);
        assertTrue(ch.exchangeDelete(x) instanceof AMQP.Exchange.DeleteOk);
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDeclarePassive(x));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void deletingMissingExchangeSucceeds() throws Exception {
        assertTrue(ch.exchangeDelete(Broker.unique("never-declared")) instanceof AMQP.Exchange.DeleteOk);
        assertTrue(ch.isOpen());
    }

    @Test
    void autoDeleteExchangeGoesWithItsLastBinding() throws Exception {
        String x = exchangeName("auto-delete");
        ch.exchangeDeclare(x, BuiltinExchangeType.FANOUT, false, true, null);
        String q = declareQueue("ad-bound");
        ch.queueBind(q, x, "");
        ch.exchangeDeclarePassive(x);
        ch.queueUnbind(q, x, "");
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDeclarePassive(x));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void exchangeToExchangeBindingRoutesAndUnbindStopsIt() throws Exception {
        String source = exchangeName("e2e-src");
        String destination = exchangeName("e2e-dst");
        ch.exchangeDeclare(source, BuiltinExchangeType.DIRECT);
        ch.exchangeDeclare(destination, BuiltinExchangeType.FANOUT);
        String q = declareQueue("e2e");
        ch.queueBind(q, destination, "");
        assertTrue(ch.exchangeBind(destination, source, "red") instanceof AMQP.Exchange.BindOk);

        ch.basicPublish(source, "red", null, Broker.bytes("red-1"));
        ch.basicPublish(source, "blue", null, Broker.bytes("blue-1"));
        ch.basicPublish(destination, "any", null, Broker.bytes("direct-1"));
        assertEquals("red-1", Broker.body(Broker.getWithin(ch, q, true)));
        assertEquals("direct-1", Broker.body(Broker.getWithin(ch, q, true)));

        assertTrue(ch.exchangeUnbind(destination, source, "red") instanceof AMQP.Exchange.UnbindOk);
        ch.basicPublish(source, "red", null, Broker.bytes("red-2"));
        ch.basicPublish(destination, "any", null, Broker.bytes("direct-2"));
        assertEquals("direct-2", Broker.body(Broker.getWithin(ch, q, true)));
        assertNull(ch.basicGet(q, true), "nothing routed after exchange.unbind");
    }

    @Test
    void exchangeToExchangeBindingReachesThroughTopicWildcards() throws Exception {
        String source = exchangeName("e2e-topic");
        String destination = exchangeName("e2e-direct");
        ch.exchangeDeclare(source, BuiltinExchangeType.TOPIC);
        ch.exchangeDeclare(destination, BuiltinExchangeType.DIRECT);
        String q = declareQueue("e2e-topic");
        ch.queueBind(q, destination, "a.b.c");
        ch.exchangeBind(destination, source, "a.#");
        ch.basicPublish(source, "a.b.c", null, Broker.bytes("routed"));
        ch.basicPublish(source, "a.x", null, Broker.bytes("dropped at destination"));
        assertEquals("routed", Broker.body(Broker.getWithin(ch, q, true)));
        ch.basicPublish("", q, null, Broker.bytes("end"));
        assertEquals("end", Broker.body(Broker.getWithin(ch, q, true)));
    }

    @Test
    void internalExchangeIsReachableThroughExchangeBinding() throws Exception {
        String internal = exchangeName("internal");
        String front = exchangeName("front");
        ch.exchangeDeclare(internal, BuiltinExchangeType.FANOUT, false, false, true, null);
        ch.exchangeDeclare(front, BuiltinExchangeType.FANOUT);
        ch.exchangeBind(internal, front, "");
        String q = declareQueue("behind-internal");
        ch.queueBind(q, internal, "");
        ch.basicPublish(front, "", null, Broker.bytes("through"));
        assertEquals("through", Broker.body(Broker.getWithin(ch, q, true)));
    }

    @Test
    void fanoutIgnoresRoutingKey() throws Exception {
        String x = exchangeName("fanout");
        ch.exchangeDeclare(x, BuiltinExchangeType.FANOUT);
        String q1 = declareQueue("fan1");
        String q2 = declareQueue("fan2");
        ch.queueBind(q1, x, "one");
        ch.queueBind(q2, x, "two");
        ch.basicPublish(x, "three", null, Broker.bytes("all"));
        assertEquals("all", Broker.body(Broker.getWithin(ch, q1, true)));
        assertEquals("all", Broker.body(Broker.getWithin(ch, q2, true)));
    }

    @Test
    void topicStarMatchesExactlyOneWordAndHashZeroOrMore() throws Exception {
        String x = exchangeName("topic");
        ch.exchangeDeclare(x, BuiltinExchangeType.TOPIC);
        String star = declareQueue("star");
        String hash = declareQueue("hash");
        ch.queueBind(star, x, "a.*.c");
        ch.queueBind(hash, x, "a.#.c");
        for (String rk : List.of("a.b.c", "a.c", "a.b.b.c", "a..c", "a.b.c.d")) {
            ch.basicPublish(x, rk, null, Broker.bytes(rk));
        }
        ch.basicPublish("", star, null, Broker.bytes("end"));
        ch.basicPublish("", hash, null, Broker.bytes("end"));
        assertEquals(List.of("a.b.c", "a..c"), drain(star));
        assertEquals(List.of("a.b.c", "a.c", "a.b.b.c", "a..c"), drain(hash));
    }

    private List<String> drain(String q) throws Exception {
        java.util.ArrayList<String> out = new java.util.ArrayList<>();
        while (true) {
            String b = Broker.body(Broker.getWithin(ch, q, true));
            if (b.equals("end")) {
                return out;
            }
            out.add(b);
        }
    }

    @Test
    void headersExchangeWithXMatchAllNeedsEveryHeader() throws Exception {
        String x = exchangeName("headers-all");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String q = declareQueue("h-all");
        ch.queueBind(q, x, "", Map.of("x-match", "all", "format", "pdf", "type", "report"));
        List<String> got = routedBodies(x, q, List.of(
                Map.of("format", "pdf", "type", "report"),              // m0 match
                Map.of("format", "pdf"),                                 // m1 missing type
                Map.of("format", "pdf", "type", "log"),                  // m2 wrong value
                Map.of("format", "pdf", "type", "report", "extra", 1),   // m3 match, extras allowed
                Map.of()));                                              // m4 nothing
        assertEquals(List.of("m0", "m3"), got);
    }

    @Test
    void headersExchangeWithoutXMatchDefaultsToAll() throws Exception {
        String x = exchangeName("headers-default");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String q = declareQueue("h-default");
        ch.queueBind(q, x, "", Map.of("format", "pdf", "type", "report"));
        List<String> got = routedBodies(x, q, List.of(
                Map.of("format", "pdf"),
                Map.of("format", "pdf", "type", "report")));
        assertEquals(List.of("m1"), got);
    }

    @Test
    void headersExchangeWithXMatchAnyNeedsOneHeader() throws Exception {
        String x = exchangeName("headers-any");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String q = declareQueue("h-any");
        ch.queueBind(q, x, "", Map.of("x-match", "any", "format", "pdf", "type", "report"));
        List<String> got = routedBodies(x, q, List.of(
                Map.of("format", "pdf"),                    // m0 match
                Map.of("type", "report"),                   // m1 match
                Map.of("format", "zip", "type", "log"),     // m2 no
                Map.of("other", "pdf"),                     // m3 no
                Map.of("format", "pdf", "type", "report"))); // m4 match
        assertEquals(List.of("m0", "m1", "m4"), got);
    }

    @Test
    void headersExchangeBindingWithVoidValueMatchesOnPresenceOnly() throws Exception {
        String x = exchangeName("headers-void");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String q = declareQueue("h-void");
        Map<String, Object> args = new HashMap<>();
        args.put("x-match", "all");
        args.put("flag", null);
        ch.queueBind(q, x, "", args);
        Map<String, Object> nullFlag = new HashMap<>();
        nullFlag.put("flag", null);
        List<String> got = routedBodies(x, q, List.of(
                Map.of("flag", "anything"),   // m0: present with any value -> match
                nullFlag,                      // m1: present, void -> match
                Map.of("other", 1)));          // m2: missing -> no
        assertEquals(List.of("m0", "m1"), got);
    }

    @Test
    void headersExchangeXMatchAllAndAnyIgnoreXPrefixedHeaders() throws Exception {
        String x = exchangeName("headers-x");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String all = declareQueue("h-all-x");
        String any = declareQueue("h-any-x");
        ch.queueBind(all, x, "", Map.of("x-match", "all", "x-tenant", "t1"));
        ch.queueBind(any, x, "", Map.of("x-match", "any", "x-tenant", "t1", "kind", "k"));
        List<String> gotAll = routedBodies(x, all, List.of(Map.of("x-tenant", "other"), Map.of()));
        // "all" with only x- keys ignores them all: every message matches
        assertEquals(List.of("m0", "m1"), gotAll);
        List<String> gotAny = routedBodies(x, any, List.of(Map.of("x-tenant", "t1"), Map.of("kind", "k")));
        assertEquals(List.of("m1"), gotAny);
    }

    @Test
    void headersExchangeAllWithXAndAnyWithXMatchXPrefixedHeaders() throws Exception {
        String x = exchangeName("headers-with-x");
        ch.exchangeDeclare(x, BuiltinExchangeType.HEADERS);
        String all = declareQueue("h-all-with-x");
        String any = declareQueue("h-any-with-x");
        ch.queueBind(all, x, "", Map.of("x-match", "all-with-x", "x-tenant", "t1", "kind", "k"));
        ch.queueBind(any, x, "", Map.of("x-match", "any-with-x", "x-tenant", "t1", "kind", "k"));
        List<Map<String, Object>> messages = List.of(
                Map.of("x-tenant", "t1", "kind", "k"),  // m0: both match
                Map.of("x-tenant", "t1"),               // m1: only the x- header
                Map.of("kind", "k"),                    // m2: only the plain header
                Map.of("x-tenant", "t2"));              // m3: none
        assertEquals(List.of("m0"), routedBodies(x, all, messages));
        // the same four messages went to the any-with-x queue too
        assertEquals(List.of("m0", "m1", "m2"), drainUntilEmpty(any));
    }

    private List<String> drainUntilEmpty(String q) throws Exception {
        java.util.ArrayList<String> out = new java.util.ArrayList<>();
        for (GetResponse r = ch.basicGet(q, true); r != null; r = ch.basicGet(q, true)) {
            out.add(Broker.body(r));
        }
        return out;
    }

    @Test
    void alternateExchangeReceivesUnroutableMessages() throws Exception {
        String ae = exchangeName("ae");
        String main = exchangeName("with-ae");
        ch.exchangeDeclare(ae, BuiltinExchangeType.FANOUT);
        ch.exchangeDeclare(main, BuiltinExchangeType.DIRECT, false, false, Map.of("alternate-exchange", ae));
        String routed = declareQueue("routed");
        String unrouted = declareQueue("unrouted");
        ch.queueBind(routed, main, "known");
        ch.queueBind(unrouted, ae, "");

        java.util.concurrent.atomic.AtomicInteger returns = new java.util.concurrent.atomic.AtomicInteger();
        ch.addReturnListener(r -> returns.incrementAndGet());
        ch.basicPublish(main, "known", true, null, Broker.bytes("to routed"));
        ch.basicPublish(main, "unknown", true, null, Broker.bytes("to ae"));

        assertEquals("to routed", Broker.body(Broker.getWithin(ch, routed, true)));
        GetResponse viaAe = Broker.getWithin(ch, unrouted, true);
        assertEquals("to ae", Broker.body(viaAe));
        assertEquals(main, viaAe.getEnvelope().getExchange(), "envelope keeps the original exchange");
        assertEquals("unknown", viaAe.getEnvelope().getRoutingKey());
        assertNull(ch.basicGet(routed, true));
        assertEquals(0, returns.get(), "a message taken by the alternate exchange is not returned");
    }
}
