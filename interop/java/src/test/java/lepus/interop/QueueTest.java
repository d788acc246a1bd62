package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import java.io.IOException;
import org.junit.jupiter.api.Test;

/** queue.* : declare (server-named, passive, exclusive, auto-delete), bind/unbind, purge, delete. */
class QueueTest extends BrokerTest {

    @Test
    void serverNamedQueueGetsAmqGenName() throws Exception {
        AMQP.Queue.DeclareOk ok = ch.queueDeclare();
        assertTrue(ok.getQueue().startsWith("amq.gen-"), ok.getQueue());
        assertEquals(0, ok.getMessageCount());
        assertEquals(0, ok.getConsumerCount());
        AMQP.Queue.DeclareOk ok2 = ch.queueDeclare("", false, true, true, null);
        assertTrue(ok2.getQueue().startsWith("amq.gen-"));
        assertTrue(!ok.getQueue().equals(ok2.getQueue()), "every server-named queue is new");
    }

    @Test
    void declareOkReportsMessageAndConsumerCounts() throws Exception {
        String q = declareQueue("counts");
        publishConfirmed(q, "m0", "m1", "m2");
        AMQP.Queue.DeclareOk again = ch.queueDeclare(q, false, false, false, null);
        assertEquals(q, again.getQueue());
        assertEquals(3, again.getMessageCount());
        assertEquals(0, again.getConsumerCount());

        String empty = declareQueue("consumed");
        Channel c2 = conn.createChannel();
        c2.basicConsume(empty, false, (t, d) -> { }, t -> { });
        c2.basicConsume(empty, false, (t, d) -> { }, t -> { });
        AMQP.Queue.DeclareOk passive = ch.queueDeclarePassive(empty);
        assertEquals(2, passive.getConsumerCount());
        assertEquals(0, passive.getMessageCount());
    }

    @Test
    void purgeReturnsNumberOfMessagesRemoved() throws Exception {
        String q = declareQueue("purge");
        publishConfirmed(q, "m0", "m1", "m2", "m3", "m4");
        assertEquals(5, ch.queuePurge(q).getMessageCount());
        assertEquals(0, ch.queueDeclarePassive(q).getMessageCount());
        assertEquals(0, ch.queuePurge(q).getMessageCount());
    }

    @Test
    void deleteReturnsNumberOfMessagesAndRemovesQueue() throws Exception {
        String q = declareQueue("delete");
        publishConfirmed(q, "a", "b");
        assertEquals(2, ch.queueDelete(q).getMessageCount());
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void deletingMissingQueueSucceedsWithZeroCount() throws Exception {
        assertEquals(0, ch.queueDelete(Broker.unique("never-declared")).getMessageCount());
        assertTrue(ch.isOpen());
    }

    @Test
    void deleteIfUnusedAndIfEmptySucceedOnIdleEmptyQueue() throws Exception {
        String q = declareQueue("idle");
        assertEquals(0, ch.queueDelete(q, true, true).getMessageCount());
        assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
    }

    @Test
    void exclusiveQueueIsDeletedWhenItsConnectionCloses() throws Exception {
        Connection owner = Broker.connect();
        String q = queueName("exclusive-gone");
        owner.createChannel().queueDeclare(q, false, true, false, null);
        ch.exchangeDeclarePassive("amq.direct"); // still fine
        owner.close();
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void exclusiveQueueIsUsableFromAnotherChannelOfTheSameConnection() throws Exception {
        String q = queueName("exclusive-same-conn");
        ch.queueDeclare(q, false, true, false, null);
        Channel other = conn.createChannel();
        other.basicPublish("", q, null, Broker.bytes("mine"));
        assertEquals("mine", Broker.body(Broker.getWithin(other, q, true)));
    }

    @Test
    void autoDeleteQueueIsDeletedWhenItsLastConsumerCancels() throws Exception {
        String q = queueName("auto-delete");
        ch.queueDeclare(q, false, false, true, null);
        String t1 = ch.basicConsume(q, true, (t, d) -> { }, t -> { });
        String t2 = ch.basicConsume(q, true, (t, d) -> { }, t -> { });
        ch.basicCancel(t1);
        assertEquals(1, ch.queueDeclarePassive(q).getConsumerCount(), "still one consumer: queue stays");
        ch.basicCancel(t2);
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void autoDeleteQueueWithoutConsumersEverStays() throws Exception {
        String q = queueName("auto-delete-unused");
        ch.queueDeclare(q, false, false, true, null);
        ch.basicPublish("", q, null, Broker.bytes("x"));
        assertEquals("x", Broker.body(Broker.getWithin(ch, q, true)));
        ch.queueDeclarePassive(q);
    }

    @Test
    void autoDeleteQueueIsDeletedWhenConsumerChannelCloses() throws Exception {
        String q = queueName("auto-delete-close");
        ch.queueDeclare(q, false, false, true, null);
        Channel consumer = conn.createChannel();
        consumer.basicConsume(q, true, (t, d) -> { }, t -> { });
        consumer.close();
        IOException e = assertThrows(IOException.class, () -> ch.queueDeclarePassive(q));
        Broker.assertChannelError(404, "NOT_FOUND", ch, e);
    }

    @Test
    void unbindStopsRouting() throws Exception {
        String q = declareQueue("unbind");
        ch.queueBind(q, "amq.direct", q);
        ch.basicPublish("amq.direct", q, null, Broker.bytes("bound"));
        assertEquals("bound", Broker.body(Broker.getWithin(ch, q, true)));
        assertTrue(ch.queueUnbind(q, "amq.direct", q) instanceof AMQP.Queue.UnbindOk);
        ch.basicPublish("amq.direct", q, null, Broker.bytes("unbound"));
        ch.basicPublish("", q, null, Broker.bytes("end"));
        assertEquals("end", Broker.body(Broker.getWithin(ch, q, true)));
        assertNull(ch.basicGet(q, true));
    }

    @Test
    void bindingTwiceIsIdempotent() throws Exception {
        String q = declareQueue("bind-twice");
        ch.queueBind(q, "amq.direct", "k");
        ch.queueBind(q, "amq.direct", "k");
        ch.basicPublish("amq.direct", "k", null, Broker.bytes("once"));
        ch.basicPublish("", q, null, Broker.bytes("end"));
        assertEquals("once", Broker.body(Broker.getWithin(ch, q, true)));
        assertEquals("end", Broker.body(Broker.getWithin(ch, q, true)));
    }

    @Test
    void durableQueueCanBeDeclaredAndRedeclared() throws Exception {
        String q = queueName("durable");
        ch.queueDeclare(q, true, false, false, null);
        assertEquals(q, ch.queueDeclare(q, true, false, false, null).getQueue());
    }
}
