package lepus.interop;

import static lepus.interop.Broker.assertChannelError;
import static lepus.interop.Broker.assertConnectionError;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BuiltinExchangeType;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Error handling as the Java client reports it: a ShutdownSignalException whose reason is the broker's
 * channel.close (soft error, connection stays open) or connection.close (hard error), with RabbitMQ's
 * exact reply code.
 */
class ErrorsTest extends BrokerTest {

    /** Waits for the channel's (or connection's) shutdown after an asynchronous error, e.g. after a publish. */
    private static ShutdownSignalException awaitShutdown(CompletableFuture<ShutdownSignalException> f) throws Exception {
        return f.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
    }

    private CompletableFuture<ShutdownSignalException> channelShutdown(Channel c) {
        CompletableFuture<ShutdownSignalException> f = new CompletableFuture<>();
        c.addShutdownListener(f::complete);
        return f;
    }

    // ---- 404 NOT_FOUND ----

    @Test
    void passiveDeclareOfMissingQueueClosesChannelWith404() {
        String q = Broker.unique("missing");
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
        ShutdownSignalException sse = assertChannelError(404, "NOT_FOUND", ch, e);
        assertTrue(Broker.replyText(sse).contains(q), Broker.replyText(sse));
        assertEquals(50, ((AMQP.Channel.Close) sse.getReason()).getClassId(), "class queue");
        assertEquals(10, ((AMQP.Channel.Close) sse.getReason()).getMethodId(), "method declare");
    }

    @Test
    void passiveDeclareOfMissingExchangeClosesChannelWith404() {
        String x = Broker.unique("missing-x");
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDeclarePassive(x));
        ShutdownSignalException sse = assertChannelError(404, "NOT_FOUND", ch, e);
        assertTrue(Broker.replyText(sse).contains(x));
    }

    @Test
    void publishToMissingExchangeClosesChannelWith404() throws Exception {
        CompletableFuture<ShutdownSignalException> shutdown = channelShutdown(ch);
        String x = Broker.unique("missing-x");
        ch.basicPublish(x, "rk", null, Broker.bytes("lost"));
        ShutdownSignalException sse = awaitShutdown(shutdown);
        assertFalse(sse.isHardError());
        assertEquals(404, Broker.replyCode(sse));
        assertTrue(Broker.replyText(sse).startsWith("NOT_FOUND") && Broker.replyText(sse).contains(x));
        assertTrue(conn.isOpen(), "a channel error leaves the connection open");
    }

    @Test
    void bindingMissingQueueClosesChannelWith404() {
        IOException e = assertThrows(IOException.class,
                () -> ch.queueBind(Broker.unique("missing"), "amq.direct", "rk"));
        assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void consumingFromMissingQueueClosesChannelWith404() {
        IOException e = assertThrows(IOException.class,
                () -> ch.basicConsume(Broker.unique("missing"), true, (t, d) -> { }, t -> { }));
        assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void basicGetFromMissingQueueClosesChannelWith404() {
        IOException e = assertThrows(IOException.class, () -> ch.basicGet(Broker.unique("missing"), true));
        assertChannelError(404, "NOT_FOUND", ch, e);
    }

    // ---- 406 PRECONDITION_FAILED ----

    @Test
    void redeclaringExchangeWithDifferentTypeClosesChannelWith406() throws Exception {
        String x = exchangeName("typed");
        ch.exchangeDeclare(x, BuiltinExchangeType.DIRECT);
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDeclare(x, BuiltinExchangeType.FANOUT));
        ShutdownSignalException sse = assertChannelError(406, "PRECONDITION_FAILED", ch, e);
        assertTrue(Broker.replyText(sse).contains("type"), Broker.replyText(sse));
        // the original exchange is unchanged
        Channel c2 = conn.createChannel();
        c2.exchangeDeclare(x, BuiltinExchangeType.DIRECT);
    }

    @Test
    void redeclaringExchangeWithDifferentDurabilityClosesChannelWith406() throws Exception {
        String x = exchangeName("durable");
        ch.exchangeDeclare(x, BuiltinExchangeType.TOPIC, true);
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDeclare(x, BuiltinExchangeType.TOPIC, false));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    @Test
    void redeclaringQueueWithDifferentArgumentsClosesChannelWith406() throws Exception {
        String q = queueName("args");
        ch.queueDeclare(q, false, false, false, Map.of("x-max-length", 10));
        IOException e = assertThrows(IOException.class,
                () -> ch.queueDeclare(q, false, false, false, Map.of("x-max-length", 20)));
        ShutdownSignalException sse = assertChannelError(406, "PRECONDITION_FAILED", ch, e);
        assertTrue(Broker.replyText(sse).contains("x-max-length"), Broker.replyText(sse));
    }

    @Test
    void redeclaringQueueWithDifferentDurabilityClosesChannelWith406() throws Exception {
        String q = queueName("durability");
        ch.queueDeclare(q, false, false, false, null);
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclare(q, true, false, false, null));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    @Test
    void ackingUnknownDeliveryTagClosesChannelWith406() throws Exception {
        CompletableFuture<ShutdownSignalException> shutdown = channelShutdown(ch);
        ch.basicAck(99, false);
        ShutdownSignalException sse = awaitShutdown(shutdown);
        assertFalse(sse.isHardError());
        assertEquals(406, Broker.replyCode(sse));
        assertTrue(Broker.replyText(sse).startsWith("PRECONDITION_FAILED - unknown delivery tag 99"), Broker.replyText(sse));
        assertTrue(conn.isOpen());
    }

    @Test
    void deletingUsedQueueWithIfUnusedClosesChannelWith406() throws Exception {
        String q = declareQueue("if-unused");
        Channel consumerCh = conn.createChannel();
        consumerCh.basicConsume(q, true, (t, d) -> { }, t -> { });
        IOException e = assertThrows(IOException.class, () -> ch.queueDelete(q, true, false));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
        assertEquals(1, conn.createChannel().queueDeclarePassive(q).getConsumerCount(), "queue still there");
    }

    @Test
    void deletingNonEmptyQueueWithIfEmptyClosesChannelWith406() throws Exception {
        String q = declareQueue("if-empty");
        publishConfirmed(q, "keep me");
        IOException e = assertThrows(IOException.class, () -> ch.queueDelete(q, false, true));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
        assertEquals(1, conn.createChannel().queueDeclarePassive(q).getMessageCount(), "queue and message still there");
    }

    @Test
    void deletingBoundExchangeWithIfUnusedClosesChannelWith406() throws Exception {
        String x = exchangeName("if-unused-x");
        ch.exchangeDeclare(x, BuiltinExchangeType.FANOUT);
        String q = declareQueue("bound");
        ch.queueBind(q, x, "");
        IOException e = assertThrows(IOException.class, () -> ch.exchangeDelete(x, true));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
        conn.createChannel().exchangeDeclarePassive(x);
    }

    @Test
    void invalidQueueArgumentTypeClosesChannelWith406() {
        IOException e = assertThrows(IOException.class,
                () -> ch.queueDeclare(queueName("bad-arg"), false, false, false, Map.of("x-max-length", "ten")));
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    @Test
    void txCommitWithoutTxSelectClosesChannelWith406() {
        IOException e = assertThrows(IOException.class, () -> ch.txCommit());
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    @Test
    void confirmSelectOnTransactionalChannelClosesChannelWith406() throws Exception {
        ch.txSelect();
        IOException e = assertThrows(IOException.class, () -> ch.confirmSelect());
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    @Test
    void txSelectOnConfirmChannelClosesChannelWith406() throws Exception {
        ch.confirmSelect();
        IOException e = assertThrows(IOException.class, () -> ch.txSelect());
        assertChannelError(406, "PRECONDITION_FAILED", ch, e);
    }

    // ---- 403 ACCESS_REFUSED ----

    @Test
    void declaringExchangeWithAmqPrefixClosesChannelWith403() {
        IOException e = assertThrows(IOException.class,
                () -> ch.exchangeDeclare("amq." + Broker.unique("reserved"), BuiltinExchangeType.DIRECT));
        assertChannelError(403, "ACCESS_REFUSED", ch, e);
    }

    @Test
    void declaringQueueWithAmqPrefixClosesChannelWith403() {
        IOException e = assertThrows(IOException.class,
                () -> ch.queueDeclare("amq." + Broker.unique("reserved"), false, false, false, null));
        assertChannelError(403, "ACCESS_REFUSED", ch, e);
    }

    @Test
    void bindingToDefaultExchangeClosesChannelWith403() throws Exception {
        String q = declareQueue("default-bind");
        IOException e = assertThrows(IOException.class, () -> ch.queueBind(q, "", "other"));
        assertChannelError(403, "ACCESS_REFUSED", ch, e);
    }

    @Test
    void publishingToInternalExchangeClosesChannelWith403() throws Exception {
        String x = exchangeName("internal");
        ch.exchangeDeclare(x, BuiltinExchangeType.FANOUT, false, false, true, null);
        CompletableFuture<ShutdownSignalException> shutdown = channelShutdown(ch);
        ch.basicPublish(x, "", null, Broker.bytes("no"));
        ShutdownSignalException sse = awaitShutdown(shutdown);
        assertFalse(sse.isHardError());
        assertEquals(403, Broker.replyCode(sse));
        assertTrue(Broker.replyText(sse).startsWith("ACCESS_REFUSED"), Broker.replyText(sse));
    }

    @Test
    void secondConsumerOnExclusivelyConsumedQueueClosesChannelWith403() throws Exception {
        String q = declareQueue("exclusive-consumer");
        ch.basicConsume(q, true, "", false, true, null, (t, d) -> { }, t -> { });
        Channel other = conn.createChannel();
        IOException e = assertThrows(IOException.class, () -> other.basicConsume(q, true, (t, d) -> { }, t -> { }));
        assertChannelError(403, "ACCESS_REFUSED", other, e);
    }

    @Test
    void exclusiveConsumeOnQueueWithConsumersClosesChannelWith403() throws Exception {
        String q = declareQueue("busy");
        ch.basicConsume(q, true, (t, d) -> { }, t -> { });
        Channel other = conn.createChannel();
        IOException e = assertThrows(IOException.class,
                () -> other.basicConsume(q, true, "", false, true, null, (t, d) -> { }, t -> { }));
        assertChannelError(403, "ACCESS_REFUSED", other, e);
    }

    // ---- 405 RESOURCE_LOCKED ----

    @Test
    void exclusiveQueueUsedFromSecondConnectionClosesChannelWith405() throws Exception {
        String q = queueName("exclusive");
        ch.queueDeclare(q, false, true, false, null);
        Connection other = otherConnection();
        Channel c1 = other.createChannel();
        IOException e1 = assertThrows(IOException.class, () -> c1.queueDeclarePassive(q));
        assertChannelError(405, "RESOURCE_LOCKED", c1, e1);
        Channel c2 = other.createChannel();
        IOException e2 = assertThrows(IOException.class, () -> c2.basicConsume(q, true, (t, d) -> { }, t -> { }));
        assertChannelError(405, "RESOURCE_LOCKED", c2, e2);
        Channel c3 = other.createChannel();
        IOException e3 = assertThrows(IOException.class, () -> c3.queueDeclare(q, false, true, false, null));
        assertChannelError(405, "RESOURCE_LOCKED", c3, e3);
    }

    // ---- connection errors ----

    @Test
    void reusingConsumerTagOnChannelIsConnectionError530() throws Exception {
        String q = declareQueue("ctag");
        ch.basicConsume(q, true, "my-tag", (t, d) -> { }, t -> { });
        Exception e = assertThrows(Exception.class, () -> ch.basicConsume(q, true, "my-tag", (t, d) -> { }, t -> { }));
        assertConnectionError(530, "NOT_ALLOWED", conn, e);
    }

    @Test
    void unknownExchangeTypeIsConnectionError503() {
        Exception e = assertThrows(Exception.class,
                () -> ch.exchangeDeclare(Broker.unique("weird"), "no-such-type"));
        assertConnectionError(503, "COMMAND_INVALID", conn, e);
    }

    @Test
    void secondChannelOpenOnOpenChannelIsConnectionError504() {
        Exception e = assertThrows(Exception.class, () -> ch.rpc(new AMQP.Channel.Open.Builder().build()));
        assertConnectionError(504, "CHANNEL_ERROR", conn, e);
    }

    @Test
    void channelFlowActiveIsAcknowledged() throws Exception {
        AMQP.Channel.FlowOk ok = (AMQP.Channel.FlowOk) ch.rpc(new AMQP.Channel.Flow.Builder().active(true).build()).getMethod();
        assertTrue(ok.getActive());
        assertTrue(ch.isOpen());
    }

    @Test
    void channelFlowInactiveIsNotImplemented540() {
        Exception e = assertThrows(Exception.class, () -> ch.rpc(new AMQP.Channel.Flow.Builder().active(false).build()));
        assertConnectionError(540, "NOT_IMPLEMENTED", conn, e);
    }
}
