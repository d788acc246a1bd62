package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.Return;
import com.rabbitmq.client.ShutdownSignalException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** basic.* : consume/cancel, qos, get, ack/nack/reject, recover, mandatory returns, priorities. */
class BasicTest extends BrokerTest {

    @Test
    void consumeWithoutTagGetsServerGeneratedCtag() throws Exception {
        String q = declareQueue("ctag");
        Broker.Inbox inbox = new Broker.Inbox();
        String tag = inbox.consume(ch, q, true);
        assertTrue(tag.startsWith("amq.ctag-"), tag);
        ch.basicPublish("", q, null, Broker.bytes("hi"));
        Delivery d = inbox.next();
        assertEquals(1, d.getEnvelope().getDeliveryTag());
        assertEquals("hi", Broker.body(d));
        assertFalse(d.getEnvelope().isRedeliver());
        assertEquals("", d.getEnvelope().getExchange());
        assertEquals(q, d.getEnvelope().getRoutingKey());
    }

    @Test
    void consumeWithClientChosenTagUsesIt() throws Exception {
        String q = declareQueue("my-ctag");
        CompletableFuture<String> deliveredTo = new CompletableFuture<>();
        String tag = ch.basicConsume(q, true, "client-tag-1", (t, d) -> deliveredTo.complete(t), t -> { });
        assertEquals("client-tag-1", tag);
        ch.basicPublish("", q, null, Broker.bytes("x"));
        assertEquals("client-tag-1", deliveredTo.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
    }

    @Test
    void deliveryTagsCountUpFromOnePerChannel() throws Exception {
        String q = declareQueue("tags");
        publishConfirmed(q, "a", "b", "c");
        assertEquals(1, ch.basicGet(q, false).getEnvelope().getDeliveryTag());
        assertEquals(2, ch.basicGet(q, false).getEnvelope().getDeliveryTag());
        Channel other = conn.createChannel();
        assertEquals(1, other.basicGet(q, false).getEnvelope().getDeliveryTag(), "tags are per channel");
    }

    @Test
    void basicCancelStopsDeliveriesAndConfirmsWithCancelOk() throws Exception {
        String q = declareQueue("cancel");
        BlockingQueue<String> events = new LinkedBlockingQueue<>();
        String tag = ch.basicConsume(q, true, new DefaultConsumer(ch) {
            @Override
            public void handleConsumeOk(String consumerTag) {
                events.add("consume-ok:" + consumerTag);
            }

            @Override
            public void handleDelivery(String consumerTag, Envelope env, AMQP.BasicProperties p, byte[] body) {
                events.add("deliver:" + new String(body));
            }

            @Override
            public void handleCancelOk(String consumerTag) {
                events.add("cancel-ok:" + consumerTag);
            }

            @Override
            public void handleCancel(String consumerTag) {
                events.add("broker-cancel:" + consumerTag);
            }
        });
        ch.basicPublish("", q, null, Broker.bytes("before"));
        assertEquals("consume-ok:" + tag, events.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        assertEquals("deliver:before", events.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        ch.basicCancel(tag);
        assertEquals("cancel-ok:" + tag, events.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        publishConfirmed(q, "after");
        assertNull(events.poll(200, TimeUnit.MILLISECONDS));
        assertEquals(0, ch.queueDeclarePassive(q).getConsumerCount());
        assertEquals(1, ch.queueDeclarePassive(q).getMessageCount());
    }

    @Test
    void deletingQueueCancelsItsConsumersWithHandleCancel() throws Exception {
        String q = declareQueue("broker-cancel");
        CompletableFuture<String> cancelled = new CompletableFuture<>();
        CompletableFuture<String> cancelOk = new CompletableFuture<>();
        String tag = ch.basicConsume(q, false, new DefaultConsumer(ch) {
            @Override
            public void handleCancel(String consumerTag) {
                cancelled.complete(consumerTag);
            }

            @Override
            public void handleCancelOk(String consumerTag) {
                cancelOk.complete(consumerTag);
            }
        });
        conn.createChannel().queueDelete(q);
        assertEquals(tag, cancelled.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        assertFalse(cancelOk.isDone(), "a broker-initiated cancel is not a cancel-ok");
        assertTrue(ch.isOpen(), "the consumer's channel stays open");
    }

    @Test
    void twoConsumersOnOneQueueShareMessagesRoundRobin() throws Exception {
        String q = declareQueue("round-robin");
        Broker.Inbox a = new Broker.Inbox();
        Broker.Inbox b = new Broker.Inbox();
        a.consume(ch, q, true);
        b.consume(ch, q, true);
        for (int i = 0; i < 4; i++) {
            ch.basicPublish("", q, null, Broker.bytes("m" + i));
        }
        List<String> gotA = List.of(a.nextBody(), a.nextBody());
        List<String> gotB = List.of(b.nextBody(), b.nextBody());
        assertEquals(List.of("m0", "m2"), gotA.get(0).equals("m0") ? gotA : gotB);
        assertEquals(List.of("m1", "m3"), gotA.get(0).equals("m0") ? gotB : gotA);
    }

    @Test
    void consumerPriorityArgumentIsHonoured() throws Exception {
        String q = declareQueue("priorities");
        ch.basicQos(2); // per consumer
        Broker.Inbox high = new Broker.Inbox();
        Broker.Inbox low = new Broker.Inbox();
        ch.basicConsume(q, false, Map.of("x-priority", 1), (t, d) -> low.deliveries.add(d), t -> { });
        ch.basicConsume(q, false, Map.of("x-priority", 10), (t, d) -> high.deliveries.add(d), t -> { });
        for (int i = 0; i < 5; i++) {
            ch.basicPublish("", q, null, Broker.bytes("m" + i));
        }
        // the high-priority consumer gets messages while it has credit; only then the low one
        assertEquals("m0", high.nextBody());
        assertEquals("m1", high.nextBody());
        assertEquals("m2", low.nextBody());
        assertEquals("m3", low.nextBody());
        Broker.fenceGet(ch, q, "m4", 0); // neither consumer took a third message
    }

    @Test
    void perConsumerQosLimitsUnackedDeliveries() throws Exception {
        String q = declareQueue("qos");
        publishConfirmed(q, "m0", "m1", "m2", "m3", "m4");
        ch.basicQos(2, false);
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q, false);
        Delivery d0 = inbox.next();
        Delivery d1 = inbox.next();
        assertEquals(List.of("m0", "m1"), List.of(Broker.body(d0), Broker.body(d1)));
        Broker.fenceGet(ch, q, "m2", 2);
        ch.basicAck(d0.getEnvelope().getDeliveryTag(), false);
        assertEquals("m3", inbox.nextBody(), "one ack frees one slot");
        Broker.fenceGet(ch, q, "m4", 0);
    }

    @Test
    void perConsumerQosAppliesToEachConsumerSeparately() throws Exception {
        String q1 = declareQueue("qos-a");
        String q2 = declareQueue("qos-b");
        publishConfirmed(q1, "a0", "a1", "a2");
        publishConfirmed(q2, "b0", "b1", "b2");
        ch.basicQos(1, false);
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q1, false);
        inbox.consume(ch, q2, false);
        List<String> got = new ArrayList<>(List.of(inbox.nextBody(), inbox.nextBody()));
        Broker.fenceGet(ch, q1, "a1", 1);
        Broker.fenceGet(ch, q2, "b1", 1);
        got.sort(null);
        assertEquals(List.of("a0", "b0"), got);
    }

    @Test
    void globalQosLimitIsSharedByAllConsumersOfTheChannel() throws Exception {
        String q1 = declareQueue("gqos-a");
        String q2 = declareQueue("gqos-b");
        publishConfirmed(q1, "a0", "a1", "a2", "a3");
        publishConfirmed(q2, "b0", "b1", "b2", "b3");
        ch.basicQos(3, true);
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q1, false);
        inbox.consume(ch, q2, false);
        List<Delivery> got = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            got.add(inbox.next());
        }
        long fromQ1 = got.stream().filter(d -> Broker.body(d).startsWith("a")).count();
        long fromQ2 = got.size() - fromQ1;
        // The fences name each queue's next message: a fourth delivery would have taken one.
        Broker.fenceGet(ch, q1, "a" + fromQ1, (int) (4 - fromQ1 - 1));
        Broker.fenceGet(ch, q2, "b" + fromQ2, (int) (4 - fromQ2 - 1));
        ch.basicAck(got.get(2).getEnvelope().getDeliveryTag(), true);
        for (int i = 0; i < 3; i++) {
            got.add(inbox.next()); // the 3 messages the fences left
        }
    }

    @Test
    void basicGetReportsRemainingMessageCountAndGetEmpty() throws Exception {
        String q = declareQueue("get");
        publishConfirmed(q, "m0", "m1", "m2");
        GetResponse r = ch.basicGet(q, true);
        assertEquals("m0", Broker.body(r));
        assertEquals(2, r.getMessageCount());
        assertFalse(r.getEnvelope().isRedeliver());
        assertEquals("", r.getEnvelope().getExchange());
        assertEquals(q, r.getEnvelope().getRoutingKey());
        assertEquals(1, ch.basicGet(q, true).getMessageCount());
        assertEquals(0, ch.basicGet(q, true).getMessageCount());
        assertNull(ch.basicGet(q, true), "basic.get-empty");
    }

    @Test
    void ackMultipleAcknowledgesAllUpToTheTag() throws Exception {
        String q = declareQueue("ack-multiple");
        publishConfirmed(q, "a", "b", "c", "d");
        Channel c = conn.createChannel();
        c.basicGet(q, false);
        c.basicGet(q, false);
        long third = c.basicGet(q, false).getEnvelope().getDeliveryTag();
        c.basicGet(q, false); // "d" stays unacked
        c.basicAck(third, true);
        c.close(); // unacked "d" goes back
        GetResponse r = Broker.getWithin(ch, q, true);
        assertEquals("d", Broker.body(r));
        assertTrue(r.getEnvelope().isRedeliver());
        assertNull(ch.basicGet(q, true));
    }

    @Test
    void nackMultipleWithRequeueRedeliversInOrderWithRedeliveredFlag() throws Exception {
        String q = declareQueue("nack");
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q, false);
        for (String b : List.of("m0", "m1", "m2")) {
            ch.basicPublish("", q, null, Broker.bytes(b));
        }
        Delivery d0 = inbox.next();
        inbox.next();
        Delivery d2 = inbox.next();
        assertFalse(d0.getEnvelope().isRedeliver());
        ch.basicNack(d2.getEnvelope().getDeliveryTag(), true, true);
        for (String b : List.of("m0", "m1", "m2")) {
            Delivery again = inbox.next();
            assertEquals(b, Broker.body(again));
            assertTrue(again.getEnvelope().isRedeliver(), "requeued messages come back redelivered");
            assertTrue(again.getEnvelope().getDeliveryTag() > d2.getEnvelope().getDeliveryTag(), "new delivery tags");
            ch.basicAck(again.getEnvelope().getDeliveryTag(), false);
        }
        inbox.assertQuiet(200);
    }

    @Test
    void nackWithoutRequeueDropsTheMessage() throws Exception {
        String q = declareQueue("nack-drop");
        publishConfirmed(q, "m0", "m1");
        GetResponse first = ch.basicGet(q, false);
        ch.basicNack(first.getEnvelope().getDeliveryTag(), false, false);
        GetResponse second = ch.basicGet(q, false);
        assertEquals("m1", Broker.body(second));
        assertFalse(second.getEnvelope().isRedeliver());
        ch.basicAck(second.getEnvelope().getDeliveryTag(), false);
        assertNull(ch.basicGet(q, true));
    }

    @Test
    void rejectWithRequeueRedeliversAndWithoutRequeueDrops() throws Exception {
        String q = declareQueue("reject");
        publishConfirmed(q, "only");
        GetResponse r1 = ch.basicGet(q, false);
        assertFalse(r1.getEnvelope().isRedeliver());
        ch.basicReject(r1.getEnvelope().getDeliveryTag(), true);
        GetResponse r2 = Broker.getWithin(ch, q, false);
        assertEquals("only", Broker.body(r2));
        assertTrue(r2.getEnvelope().isRedeliver());
        ch.basicReject(r2.getEnvelope().getDeliveryTag(), false);
        ch.basicPublish("", q, null, Broker.bytes("end"));
        assertEquals("end", Broker.body(Broker.getWithin(ch, q, true)), "the rejected message is gone");
    }

    @Test
    void recoverRedeliversUnackedMessagesWithRedeliveredFlag() throws Exception {
        String q = declareQueue("recover");
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q, false);
        ch.basicPublish("", q, null, Broker.bytes("m0"));
        ch.basicPublish("", q, null, Broker.bytes("m1"));
        Delivery d0 = inbox.next();
        Delivery d1 = inbox.next();
        ch.basicAck(d0.getEnvelope().getDeliveryTag(), false);
        assertTrue(ch.basicRecover(true) instanceof AMQP.Basic.RecoverOk);
        Delivery again = inbox.next();
        assertEquals("m1", Broker.body(again));
        assertTrue(again.getEnvelope().isRedeliver());
        assertFalse(d1.getEnvelope().isRedeliver());
        ch.basicAck(again.getEnvelope().getDeliveryTag(), false);
        inbox.assertQuiet(200);
    }

    @Test
    void closingChannelRequeuesUnackedMessagesAsRedelivered() throws Exception {
        String q = declareQueue("close-requeue");
        Channel c = conn.createChannel();
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(c, q, false);
        ch.basicPublish("", q, null, Broker.bytes("unacked"));
        assertFalse(inbox.next().getEnvelope().isRedeliver());
        c.close();
        GetResponse r = Broker.getWithin(ch, q, true);
        assertEquals("unacked", Broker.body(r));
        assertTrue(r.getEnvelope().isRedeliver());
    }

    @Test
    void noAckConsumerRemovesMessagesOnDelivery() throws Exception {
        String q = declareQueue("no-ack");
        Channel c = conn.createChannel();
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(c, q, true);
        ch.basicPublish("", q, null, Broker.bytes("gone"));
        assertEquals("gone", inbox.nextBody());
        c.close();
        assertEquals(0, ch.queueDeclarePassive(q).getMessageCount(), "nothing requeued for a no-ack consumer");
    }

    @Test
    void mandatoryUnroutablePublishIsReturnedWith312NoRoute() throws Exception {
        CompletableFuture<Return> returned = new CompletableFuture<>();
        ch.addReturnListener(returned::complete);
        String x = exchangeName("no-route");
        ch.exchangeDeclare(x, "direct");
        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder().messageId("id-1").contentType("text/plain").build();
        ch.basicPublish(x, "nobody-home", true, props, Broker.bytes("bounce"));
        Return r = returned.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        assertEquals(312, r.getReplyCode());
        assertEquals("NO_ROUTE", r.getReplyText());
        assertEquals(x, r.getExchange());
        assertEquals("nobody-home", r.getRoutingKey());
        assertEquals("id-1", r.getProperties().getMessageId());
        assertEquals("text/plain", r.getProperties().getContentType());
        assertEquals("bounce", new String(r.getBody()));
        assertTrue(ch.isOpen());
    }

    @Test
    void mandatoryRoutablePublishIsNotReturned() throws Exception {
        List<Return> returns = new ArrayList<>();
        ch.addReturnListener(returns::add);
        String q = declareQueue("routable");
        ch.confirmSelect();
        ch.basicPublish("", q, true, null, Broker.bytes("delivered"));
        ch.basicPublish("", Broker.unique("nowhere"), false, null, Broker.bytes("dropped silently"));
        ch.waitForConfirmsOrDie(Broker.TIMEOUT_MS);
        assertTrue(returns.isEmpty(), "returns: " + returns.size());
        assertEquals("delivered", Broker.body(Broker.getWithin(ch, q, true)));
    }

    @Test
    void immediateFlagIsNotImplemented540() throws Exception {
        String q = declareQueue("immediate");
        CompletableFuture<ShutdownSignalException> shutdown = new CompletableFuture<>();
        conn.addShutdownListener(shutdown::complete);
        ch.basicPublish("", q, false, true, null, Broker.bytes("now"));
        ShutdownSignalException sse = shutdown.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        assertTrue(sse.isHardError());
        assertEquals(540, Broker.replyCode(sse));
        assertTrue(Broker.replyText(sse).startsWith("NOT_IMPLEMENTED"), Broker.replyText(sse));
    }

    @Test
    void publishedMessagesArriveInOrder() throws Exception {
        String q = declareQueue("order");
        Broker.Inbox inbox = new Broker.Inbox();
        inbox.consume(ch, q, true);
        for (int i = 0; i < 500; i++) {
            ch.basicPublish("", q, null, Broker.bytes(Integer.toString(i)));
        }
        for (int i = 0; i < 500; i++) {
            assertEquals(Integer.toString(i), inbox.nextBody());
        }
    }

    @Test
    void cancelOfUnknownConsumerTagIsHarmless() throws Exception {
        // RabbitMQ answers basic.cancel for an unknown tag with cancel-ok
        AMQP.Basic.CancelOk ok = (AMQP.Basic.CancelOk) ch.rpc(
                new AMQP.Basic.Cancel.Builder().consumerTag("no-such-tag").build()).getMethod();
        assertEquals("no-such-tag", ok.getConsumerTag());
        assertTrue(ch.isOpen());
        assertNotNull(ch.queueDeclare());
    }
}
