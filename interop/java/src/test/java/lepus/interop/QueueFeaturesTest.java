package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.GetResponse;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * The queue features RabbitMQ applications declare (issue 12) through the RabbitMQ Java client:
 * dead-lettering with x-death, TTL, x-expires, max-length and max-length-bytes with each overflow
 * mode, single active consumer, priorities, direct reply-to and the consistent-hash exchange (by
 * routing key and by hash-header) pass against RabbitMQ 3.10.8 and Lepus alike.
 * Lepus only, each saying why: x-delivery-limit on classic queues and x-consumer-timeout (RabbitMQ
 * 3.10.8 refuses the first and ignores the second), the delayed-message exchange (a plugin the
 * reference node does not have), message deduplication (beyond RabbitMQ).
 */
class QueueFeaturesTest extends BrokerTest {

    private static Map<String, Object> args(Object... keysAndValues) {
        Map<String, Object> map = new HashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            map.put((String) keysAndValues[i], keysAndValues[i + 1]);
        }
        return map;
    }

    /** Two queues bound to consistent-hash exchange `x` with weights 1 and 3: {light, heavy}. */
    private String[] bindByWeight(String x, String prefix) throws IOException {
        String light = declare(prefix + "-light", null);
        String heavy = declare(prefix + "-heavy", null);
        ch.queueBind(light, x, "1");
        ch.queueBind(heavy, x, "3");
        return new String[] {light, heavy};
    }

    private String declare(String prefix, Map<String, Object> arguments) throws IOException {
        String q = queueName(prefix);
        ch.queueDeclare(q, false, false, false, arguments);
        return q;
    }

    private boolean brokerIsLepus() {
        return "Lepus".equals(String.valueOf(conn.getServerProperties().get("product")));
    }

    private void assumeLepus(String why) {
        Assumptions.assumeTrue(brokerIsLepus(), "Lepus only: " + why);
    }

    private static AMQP.BasicProperties headers(Map<String, Object> headers) {
        return new AMQP.BasicProperties.Builder().headers(headers).build();
    }

    /** basic.get of every ready message's body (auto-ack). */
    private List<String> drain(String q) throws IOException {
        List<String> bodies = new ArrayList<>();
        for (GetResponse r = ch.basicGet(q, true); r != null; r = ch.basicGet(q, true)) {
            bodies.add(Broker.body(r));
        }
        return bodies;
    }

    @Test
    void aRejectedMessageIsDeadLetteredWithItsXDeathHeader() throws Exception {
        String target = declare("dlx-target", null);
        String source = declare("dlx-source", args("x-dead-letter-exchange", "", "x-dead-letter-routing-key", target));
        publishConfirmed(source, "doomed");
        GetResponse got = Broker.getWithin(ch, source, false);
        ch.basicReject(got.getEnvelope().getDeliveryTag(), false);
        GetResponse dead = Broker.getWithin(ch, target, true);
        assertEquals("doomed", Broker.body(dead));
        Map<String, Object> h = dead.getProps().getHeaders();
        @SuppressWarnings("unchecked")
        List<Map<String, Object>> deaths = (List<Map<String, Object>>) h.get("x-death");
        assertEquals(1, deaths.size());
        Map<String, Object> death = deaths.get(0);
        assertEquals(1L, death.get("count"), "count is a long");
        assertEquals("rejected", death.get("reason").toString());
        assertEquals(source, death.get("queue").toString());
        assertEquals("", death.get("exchange").toString());
        assertEquals(List.of(source), ((List<?>) death.get("routing-keys")).stream().map(Object::toString).toList());
        assertTrue(death.get("time") instanceof java.util.Date, "time is a timestamp");
        assertEquals("rejected", h.get("x-first-death-reason").toString());
        assertEquals(source, h.get("x-first-death-queue").toString());
    }

    @Test
    void anExpiredMessageIsDeadLetteredWithItsOriginalExpiration() throws Exception {
        String target = declare("ttl-target", null);
        String source = declare("ttl-source", args("x-dead-letter-exchange", "", "x-dead-letter-routing-key", target));
        ch.basicPublish("", source, new AMQP.BasicProperties.Builder().expiration("50").build(), Broker.bytes("short-lived"));
        GetResponse dead = Broker.getWithin(ch, target, true);
        assertEquals("short-lived", Broker.body(dead));
        assertNull(dead.getProps().getExpiration(), "the expiration is removed");
        @SuppressWarnings("unchecked")
        Map<String, Object> death = ((List<Map<String, Object>>) dead.getProps().getHeaders().get("x-death")).get(0);
        assertEquals("expired", death.get("reason").toString());
        assertEquals("50", death.get("original-expiration").toString());

        String queueTtl = declare("queue-ttl", args("x-message-ttl", 100));
        publishConfirmed(queueTtl, "gone");
        Thread.sleep(300);
        assertNull(ch.basicGet(queueTtl, true), "x-message-ttl expired it");
    }

    @Test
    void maxLengthDropsTheHeadOrRejectsThePublish() throws Exception {
        String dropHead = declare("maxlen-drop", args("x-max-length", 2));
        publishConfirmed(dropHead, "m1", "m2", "m3");
        assertEquals(List.of("m2", "m3"), drain(dropHead));

        String reject = declare("maxlen-reject", args("x-max-length", 1, "x-overflow", "reject-publish"));
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        confirms.basicPublish("", reject, null, Broker.bytes("kept"));
        assertTrue(confirms.waitForConfirms(Broker.TIMEOUT_MS));
        confirms.basicPublish("", reject, null, Broker.bytes("refused"));
        assertFalse(confirms.waitForConfirms(Broker.TIMEOUT_MS), "the publish past the limit is nacked");
        assertEquals(List.of("kept"), drain(reject));
    }

    @Test
    void aSingleActiveConsumerGetsEverythingAndTheNextTakesOverWhenItCancels() throws Exception {
        String q = declare("sac", args("x-single-active-consumer", true));
        Broker.Inbox first = new Broker.Inbox();
        Broker.Inbox second = new Broker.Inbox();
        Channel other = conn.createChannel();
        String firstTag = first.consume(ch, q, true);
        second.consume(other, q, true);
        publishConfirmed(q, "a", "b");
        assertEquals("a", first.nextBody());
        assertEquals("b", first.nextBody());
        second.assertQuiet(300);
        ch.basicCancel(firstTag);
        publishConfirmed(q, "c");
        assertEquals("c", second.nextBody());

        // An exclusive consumer on a single-active-consumer queue is refused, as RabbitMQ refuses it.
        Channel exclusive = conn.createChannel();
        IOException refused = assertThrows(IOException.class,
                () -> exclusive.basicConsume(q, true, "", false, true, null, (t, d) -> { }, t -> { }));
        Broker.assertChannelError(403, "ACCESS_REFUSED", exclusive, refused);
    }

    @Test
    void higherPrioritiesAreDeliveredFirstFifoWithinOne() throws Exception {
        String q = declare("priority", args("x-max-priority", 5));
        int[] priorities = {0, 5, 1, 9, 5, 2};
        String[] bodies = {"a0", "c5", "d1", "h9", "e5", "g2"};
        for (int i = 0; i < bodies.length; i++) {
            ch.basicPublish("", q, new AMQP.BasicProperties.Builder().priority(priorities[i]).build(), Broker.bytes(bodies[i]));
        }
        Broker.getWithin(ch, q, false);
        ch.basicRecover(true);
        assertEquals(List.of("c5", "h9", "e5", "g2", "d1", "a0"), drain(q));

        IOException refused = assertThrows(IOException.class,
                () -> ch.queueDeclare(queueName("priority-bad"), false, false, false, args("x-max-priority", 256)));
        Broker.assertChannelError(406, "PRECONDITION_FAILED", ch, refused);
        assertTrue(Broker.replyText(Broker.shutdownSignal(refused)).endsWith("{max_value_exceeded,256}"));
    }

    @Test
    void directReplyToRoutesTheReplyToTheRequestingChannel() throws Exception {
        String service = declare("rpc-service", null);
        BlockingQueue<Delivery> replies = new LinkedBlockingQueue<>();
        ch.basicConsume("amq.rabbitmq.reply-to", true, (t, d) -> replies.add(d), t -> { });
        Channel server = conn.createChannel();
        server.basicConsume(service, true, (t, request) -> {
            String replyTo = request.getProperties().getReplyTo();
            server.basicPublish("", replyTo, null, Broker.bytes("reply to " + Broker.body(request)));
        }, t -> { });
        ch.basicPublish("", service, new AMQP.BasicProperties.Builder().replyTo("amq.rabbitmq.reply-to").build(), Broker.bytes("ping"));
        Delivery reply = replies.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        assertNotNull(reply, "no reply");
        assertEquals("reply to ping", Broker.body(reply));
    }

    @Test
    void theConsistentHashExchangeSpreadsByWeightAndDeliversEachMessageOnce() throws Exception {
        String x = exchangeName("hash");
        ch.exchangeDeclare(x, "x-consistent-hash");
        String[] lightAndHeavy = bindByWeight(x, "hash");
        String light = lightAndHeavy[0];
        String heavy = lightAndHeavy[1];
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        for (int i = 0; i < 400; i++) {
            confirms.basicPublish(x, "key-" + i, null, Broker.bytes("m" + i));
        }
        confirms.waitForConfirmsOrDie(Broker.TIMEOUT_MS);
        List<String> lightBodies = drain(light);
        List<String> heavyBodies = drain(heavy);
        Set<String> all = new HashSet<>(lightBodies);
        all.addAll(heavyBodies);
        assertEquals(400, lightBodies.size() + heavyBodies.size());
        assertEquals(400, all.size(), "each message exactly once");
        assertTrue(heavyBodies.size() > lightBodies.size(), "weight 3 takes more than weight 1: " + heavyBodies.size() + " vs " + lightBodies.size());
    }

    /**
     * Whether a queue exists, by a passive queue.declare on a channel of its own. RabbitMQ counts
     * the passive declare as a use (it renews an x-expires lease), so a test asks once, at the end
     * of its wait. A missing queue is RabbitMQ's 404 with its text.
     */
    private boolean queueExists(String q) throws Exception {
        Channel probe = conn.createChannel();
        try {
            probe.queueDeclarePassive(q);
            probe.close();
            return true;
        } catch (IOException e) {
            Broker.assertChannelError(404, "NOT_FOUND - no queue '" + q + "' in vhost '/'", probe, e);
            return false;
        }
    }

    @Test
    void xExpiresDeletesAQueueUnusedForThatLongButNotOneWithAConsumerOrPolled() throws Exception {
        // 1 s leases; the waits are 2.5 s, so a broker late by up to 1.5 s still passes.
        String unused = declare("expires-unused", args("x-expires", 1000));
        String consumed = declare("expires-consumed", args("x-expires", 1000));
        String polled = declare("expires-polled", args("x-expires", 1000));
        Channel consumer = conn.createChannel();
        String tag = new Broker.Inbox().consume(consumer, consumed, true);
        long deadline = System.currentTimeMillis() + 2_500;
        while (System.currentTimeMillis() < deadline) {
            assertNull(ch.basicGet(polled, true), "basic.get on the empty queue renews its lease");
            Thread.sleep(200);
        }
        assertFalse(queueExists(unused), "the queue nobody used for 2.5 s outlived its x-expires of 1 s");
        assertTrue(queueExists(consumed), "a queue with a consumer expired");
        assertTrue(queueExists(polled), "a queue polled with basic.get every 200 ms expired");
        // The lease starts when the last consumer goes.
        consumer.basicCancel(tag);
        Thread.sleep(2_500);
        assertFalse(queueExists(consumed), "the queue outlived its x-expires after its consumer cancelled");
    }

    @Test
    void maxLengthBytesDropsTheHeadUntilTheBodiesFit() throws Exception {
        String q = declare("maxbytes-drop", args("x-max-length-bytes", 10));
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        // Only bodies count: 100 bytes of headers on each message change nothing.
        AMQP.BasicProperties padded = headers(args("padding", "h".repeat(100)));
        for (String body : new String[] {"aaaa", "bbbb", "cccc", "dd"}) {
            confirms.basicPublish("", q, padded, Broker.bytes(body));
        }
        assertTrue(confirms.waitForConfirms(Broker.TIMEOUT_MS), "drop-head acks every publish");
        assertEquals(List.of("bbbb", "cccc", "dd"), drain(q), "10 bytes of bodies are kept, the oldest dropped");
    }

    @Test
    void maxLengthBytesWithRejectPublishNacksThePublishThatWouldNotFit() throws Exception {
        String q = declare("maxbytes-reject", args("x-max-length-bytes", 10, "x-overflow", "reject-publish"));
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        // 4 + 6 bytes fill the queue exactly (at the limit is allowed); one byte more is refused,
        // an empty body still fits: bytes decide, not the message count.
        String[] bodies = {"aaaa", "bbbbbb", "c", ""};
        boolean[] want = {true, true, false, true};
        for (int i = 0; i < bodies.length; i++) {
            confirms.basicPublish("", q, null, Broker.bytes(bodies[i]));
            assertEquals(want[i], confirms.waitForConfirms(Broker.TIMEOUT_MS), "confirm of '" + bodies[i] + "' (true: basic.ack)");
        }
        assertEquals(List.of("aaaa", "bbbbbb", ""), drain(q));
    }

    @Test
    void rejectPublishDlxNacksThePublishAndDeadLettersIt() throws Exception {
        String target = declare("reject-dlx-target", null);
        String q = declare("reject-dlx", args("x-max-length", 1, "x-overflow", "reject-publish-dlx",
                "x-dead-letter-exchange", "", "x-dead-letter-routing-key", target));
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        confirms.basicPublish("", q, null, Broker.bytes("kept"));
        assertTrue(confirms.waitForConfirms(Broker.TIMEOUT_MS), "the first publish fits");
        confirms.basicPublish("", q, null, Broker.bytes("overflow"));
        assertFalse(confirms.waitForConfirms(Broker.TIMEOUT_MS), "the publish past the limit is nacked");
        GetResponse dead = Broker.getWithin(ch, target, true);
        assertEquals("overflow", Broker.body(dead));
        @SuppressWarnings("unchecked")
        List<Map<String, Object>> deaths = (List<Map<String, Object>>) dead.getProps().getHeaders().get("x-death");
        assertEquals(1, deaths.size());
        assertEquals("maxlen", deaths.get(0).get("reason").toString());
        assertEquals(q, deaths.get(0).get("queue").toString());
        assertEquals("maxlen", dead.getProps().getHeaders().get("x-first-death-reason").toString());
        assertEquals(List.of("kept"), drain(q), "the refused message is not in the queue");
        assertEquals(List.of(), drain(target), "dead-lettered once");
    }

    @Test
    void theConsistentHashExchangeWithHashHeaderKeepsEachValueOnOneQueueAndSpreadsByWeight() throws Exception {
        String x = exchangeName("hash-header");
        ch.exchangeDeclare(x, "x-consistent-hash", false, false, args("hash-header", "shard"));
        String[] lightAndHeavy = bindByWeight(x, "hash-header");
        String light = lightAndHeavy[0];
        String heavy = lightAndHeavy[1];
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        int values = 200;
        for (int round = 0; round < 3; round++) {
            for (int v = 0; v < values; v++) {
                // A routing key of its own for every message: only the header may decide.
                confirms.basicPublish(x, "rk-" + round + "-" + v, headers(args("shard", "v-" + v)), Broker.bytes("v-" + v));
            }
        }
        confirms.waitForConfirmsOrDie(Broker.TIMEOUT_MS);
        List<String> lightBodies = drain(light);
        List<String> heavyBodies = drain(heavy);
        assertEquals(3 * values, lightBodies.size() + heavyBodies.size(), "every message routed once");
        Set<String> lightValues = new HashSet<>(lightBodies);
        Set<String> heavyValues = new HashSet<>(heavyBodies);
        Set<String> both = new HashSet<>(lightValues);
        both.retainAll(heavyValues);
        assertEquals(Set.of(), both, "values that reached both queues");
        assertEquals(values, lightValues.size() + heavyValues.size());
        assertEquals(3 * lightValues.size(), lightBodies.size(), "each value's three messages together");
        // Weights 1 and 3: a quarter and three quarters of the values, expected 50 and 150.
        assertTrue(heavyValues.size() >= 2 * lightValues.size() && !lightValues.isEmpty(),
                "weight 3 vs weight 1: " + heavyValues.size() + " vs " + lightValues.size() + " values");
    }

    @Test
    void aSingleActiveConsumerHandsOverInRegistrationOrderWhenItsChannelClosesOrItCancels() throws Exception {
        String q = declare("sac-order", args("x-single-active-consumer", true));
        // Registered A, B, C, D on channels 2, 4, 5, 3: a broker choosing the next by the lowest
        // channel number (D) or the highest (C), rather than by registration (B), fails.
        Channel channelA = conn.createChannel(2);
        Channel channelD = conn.createChannel(3);
        Channel channelB = conn.createChannel(4);
        Channel channelC = conn.createChannel(5);
        Broker.Inbox a = new Broker.Inbox();
        Broker.Inbox b = new Broker.Inbox();
        Broker.Inbox c = new Broker.Inbox();
        Broker.Inbox d = new Broker.Inbox();
        a.consume(channelA, q, false);
        String tagB = b.consume(channelB, q, false);
        c.consume(channelC, q, false);
        d.consume(channelD, q, false);
        publishConfirmed(q, "m1", "m2");
        Delivery m1 = a.next();
        assertEquals("m1", Broker.body(m1));
        assertFalse(m1.getEnvelope().isRedeliver());
        assertEquals("m2", a.nextBody());
        channelA.basicAck(m1.getEnvelope().getDeliveryTag(), false);
        b.assertQuiet(300);
        c.assertQuiet(0);
        d.assertQuiet(0);
        // A's channel closes with m2 unacked: B, registered second, takes over and gets m2 again.
        channelA.close();
        Delivery redelivered = b.next();
        assertEquals("m2", Broker.body(redelivered));
        assertTrue(redelivered.getEnvelope().isRedeliver());
        channelB.basicAck(redelivered.getEnvelope().getDeliveryTag(), false);
        publishConfirmed(q, "m3");
        Delivery m3 = b.next();
        assertEquals("m3", Broker.body(m3));
        channelB.basicAck(m3.getEnvelope().getDeliveryTag(), false);
        c.assertQuiet(300);
        d.assertQuiet(0);
        // B cancels: C, registered third, takes over.
        channelB.basicCancel(tagB);
        publishConfirmed(q, "m4");
        assertEquals("m4", c.nextBody());
        b.assertQuiet(300);
        d.assertQuiet(0);
        a.assertQuiet(0);
    }

    @Test
    void aDeliveryLimitDeadLettersAMessageRequeuedTooOften() throws Exception {
        assumeLepus("RabbitMQ 3.10.8 refuses x-delivery-limit on classic queues; Lepus takes it as quorum queues do");
        String target = declare("limit-target", null);
        String q = declare("limit", args("x-delivery-limit", 1, "x-dead-letter-exchange", "", "x-dead-letter-routing-key", target));
        publishConfirmed(q, "bounced");
        GetResponse first = Broker.getWithin(ch, q, false);
        ch.basicNack(first.getEnvelope().getDeliveryTag(), false, true);
        GetResponse second = Broker.getWithin(ch, q, false);
        assertEquals(1L, ((Number) second.getProps().getHeaders().get("x-delivery-count")).longValue());
        ch.basicNack(second.getEnvelope().getDeliveryTag(), false, true);
        GetResponse dead = Broker.getWithin(ch, target, true);
        @SuppressWarnings("unchecked")
        Map<String, Object> death = ((List<Map<String, Object>>) dead.getProps().getHeaders().get("x-death")).get(0);
        assertEquals("delivery_limit", death.get("reason").toString());
    }

    @Test
    void aConsumerTimeoutClosesTheChannelThatHeldADeliveryTooLong() throws Exception {
        assumeLepus("RabbitMQ 3.10.8 ignores x-consumer-timeout (its node-wide default is 30 minutes)");
        // A broker of its own: connections sample their channels every quarter of the node's
        // timeout (at least each second, at most each minute), here every 2 s. A delivery is
        // first seen at most one sample after it left and found overdue one to two samples
        // later (never early), so the queue's 1 s closes the channel within 5 s, well before the
        // node's 8 s even on a loaded machine (CI saw more than 4 s once with 1 s samples).
        try (PrivateLepus lepus = PrivateLepus.start(Map.of(), "--consumer-timeout-ms", "8000");
                com.rabbitmq.client.Connection own = lepus.factory().newConnection()) {
            Channel setup = own.createChannel();
            String q = Broker.unique("timeout");
            setup.queueDeclare(q, false, false, false, args("x-consumer-timeout", 1000));
            setup.basicPublish("", q, null, Broker.bytes("held"));
            Channel consumer = own.createChannel();
            Broker.Inbox inbox = new Broker.Inbox();
            inbox.consume(consumer, q, false);
            long delivered = System.currentTimeMillis();
            inbox.next();
            while (consumer.isOpen() && System.currentTimeMillis() < delivered + 15_000) {
                Thread.sleep(50);
            }
            assertFalse(consumer.isOpen(), "the channel was not closed");
            assertTrue(System.currentTimeMillis() - delivered < 8_000, "closed by the queue's 1 s, not the node's 8 s");
            com.rabbitmq.client.ShutdownSignalException reason = consumer.getCloseReason();
            assertEquals(406, Broker.replyCode(reason));
            assertTrue(Broker.replyText(reason).startsWith("PRECONDITION_FAILED - delivery acknowledgement on channel"), Broker.replyText(reason));
            assertEquals(1, setup.queueDeclarePassive(q).getMessageCount(), "the message went back");
        }
    }

    @Test
    void theDelayedMessageExchangeHoldsAMessageForItsXDelay() throws Exception {
        assumeLepus("the RabbitMQ reference node lacks rabbitmq_delayed_message_exchange (not in Debian's package)");
        String x = exchangeName("delayed");
        ch.exchangeDeclare(x, "x-delayed-message", false, false, args("x-delayed-type", "direct"));
        String q = declare("delayed-target", null);
        ch.queueBind(q, x, "k");
        long published = System.nanoTime();
        ch.basicPublish(x, "k", headers(args("x-delay", 400)), Broker.bytes("later"));
        ch.basicPublish(x, "k", null, Broker.bytes("now"));
        GetResponse now = Broker.getWithin(ch, q, true);
        assertEquals("now", Broker.body(now));
        assertNull(ch.basicGet(q, true), "the delayed one waits");
        GetResponse later = Broker.getWithin(ch, q, true);
        assertTrue(System.nanoTime() - published >= 400_000_000L, "delivered before its delay");
        assertEquals("later", Broker.body(later));
        assertEquals(-400, ((Number) later.getProps().getHeaders().get("x-delay")).intValue());
    }

    @Test
    void aDeduplicatingExchangeRoutesEachKeyOnce() throws Exception {
        assumeLepus("message deduplication is beyond RabbitMQ (LavinMQ's feature, a plugin's for RabbitMQ)");
        String x = exchangeName("dedup");
        ch.exchangeDeclare(x, "fanout", false, false, args("x-message-deduplication", true, "x-cache-size", 10));
        String q = declare("dedup-target", null);
        ch.queueBind(q, x, "");
        Channel confirms = conn.createChannel();
        confirms.confirmSelect();
        for (String key : new String[] {"a", "b", "a"}) {
            confirms.basicPublish(x, "", headers(args("x-deduplication-header", key)), Broker.bytes(key));
        }
        confirms.waitForConfirmsOrDie(Broker.TIMEOUT_MS);
        assertEquals(List.of("a", "b"), drain(q));
    }
}
