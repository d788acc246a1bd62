package streaminterop

// Bad input over a raw socket (no client library would send it): an unknown command, a
// malformed frame, an oversized frame, frames out of order before open, a subscription without
// credit. Each gets the response code RabbitMQ 3.10.8 answers with, the connection closed where
// it closes it, and a client on another connection goes on undisturbed.

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

type rawConn struct {
	t    *testing.T
	conn net.Conn
	id   uint32
}

func frame(key uint16, body ...[]byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, key)
	payload = binary.BigEndian.AppendUint16(payload, 1)
	for _, part := range body {
		payload = append(payload, part...)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

func u8(value uint8) []byte    { return []byte{value} }
func u16(value uint16) []byte  { return binary.BigEndian.AppendUint16(nil, value) }
func u32(value uint32) []byte  { return binary.BigEndian.AppendUint32(nil, value) }
func u64(value uint64) []byte  { return binary.BigEndian.AppendUint64(nil, value) }
func text(value string) []byte { return append(u16(uint16(len(value))), value...) }

func dialRaw(t *testing.T) *rawConn {
	t.Helper()
	host, port := hostPort(t, streamURL())
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), waitTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConn{t: t, conn: conn}
}

func (c *rawConn) send(data []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// request sends a frame with the next correlation id before body.
func (c *rawConn) request(key uint16, body ...[]byte) {
	c.id++
	c.send(frame(key, append([][]byte{u32(c.id)}, body...)...))
}

// receive reads the next frame that is not a heartbeat: its key and what follows the version.
func (c *rawConn) receive() (uint16, []byte) {
	c.t.Helper()
	for {
		_ = c.conn.SetReadDeadline(time.Now().Add(waitTimeout))
		header := make([]byte, 4)
		if _, err := io.ReadFull(c.conn, header); err != nil {
			c.t.Fatalf("read: %v", err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(header))
		if _, err := io.ReadFull(c.conn, payload); err != nil {
			c.t.Fatalf("read: %v", err)
		}
		key := binary.BigEndian.Uint16(payload)
		if key != 0x0017 {
			return key, payload[4:]
		}
	}
}

// expect reads the next frame and checks its key and response code (after the correlation id
// for answers that carry one).
func (c *rawConn) expect(key uint16, code uint16) []byte {
	c.t.Helper()
	gotKey, rest := c.receive()
	if gotKey != key {
		c.t.Fatalf("got key %#04x, want %#04x", gotKey, key)
	}
	at := 4
	if key == 0x8009 {
		at = 0
	}
	if gotCode := binary.BigEndian.Uint16(rest[at:]); gotCode != code {
		c.t.Fatalf("key %#04x: got code %d, want %d", key, gotCode, code)
	}
	return rest
}

// closedWithoutAnswer checks the server drops the socket without sending anything.
func (c *rawConn) closedWithoutAnswer() {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(waitTimeout))
	got, err := c.conn.Read(make([]byte, 64))
	if got != 0 || !(errors.Is(err, io.EOF) || isReset(err)) {
		c.t.Fatalf("expected the socket closed without an answer, read %d bytes, %v", got, err)
	}
}

func isReset(err error) bool {
	var opError *net.OpError
	return errors.As(err, &opError)
}

// open runs the handshake as guest on vhost /.
func (c *rawConn) open() {
	c.t.Helper()
	c.request(0x0011, u32(0))
	c.expect(0x8011, 1)
	c.request(0x0012)
	c.expect(0x8012, 1)
	c.request(0x0013, text("PLAIN"), u32(12), []byte("\x00guest\x00guest"))
	c.expect(0x8013, 1)
	key, tune := c.receive()
	if key != 0x0014 {
		c.t.Fatalf("expected tune, got %#04x", key)
	}
	c.send(frame(0x8014, tune[:4], u32(0)))
	c.request(0x0015, text("/"))
	c.expect(0x8015, 1)
}

// expectClose reads the server's close, checks its code and reason, answers it and sees the
// socket closed.
func (c *rawConn) expectClose(code uint16, reason string) {
	c.t.Helper()
	rest := c.expect(0x0016, code)
	if got := string(rest[8:]); got != reason {
		c.t.Fatalf("close reason %q, want %q", got, reason)
	}
	c.send(frame(0x8016, rest[:4], u16(1)))
	c.closedWithoutAnswer()
}

// undisturbed checks that a client on another connection still publishes and consumes.
func undisturbed(t *testing.T) {
	t.Helper()
	env := environment(t, streamURL())
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	confirms := producer.NotifyPublishConfirmation()
	if err := producer.Send(amqp.NewMessage([]byte("still here"))); err != nil {
		t.Fatalf("send: %v", err)
	}
	waitConfirmed(t, confirms, 1)
	got, _ := consume(t, env, name, stream.OffsetSpecification{}.First()).wait(t, 1)
	equal(t, "bodies", got, []string{"still here"})
}

func TestUnknownCommandGetsCloseUnknownFrame(t *testing.T) {
	c := dialRaw(t)
	c.open()
	c.send(frame(0x0033, u32(1)))
	c.expectClose(13, "unknown frame")
	undisturbed(t)
}

func TestMalformedFrameGetsCloseUnknownFrame(t *testing.T) {
	c := dialRaw(t)
	c.open()
	// A declare publisher without its stream name.
	c.send(frame(0x0001, u32(7), u8(1), text("ref")))
	c.expectClose(13, "unknown frame")
	undisturbed(t)
}

func TestOutOfOrderBeforeOpenDropsTheSocket(t *testing.T) {
	early := dialRaw(t)
	early.send(frame(0x0033))
	early.closedWithoutAnswer()
	// Open before authenticating.
	skipped := dialRaw(t)
	skipped.request(0x0011, u32(0))
	skipped.expect(0x8011, 1)
	skipped.request(0x0015, text("/"))
	skipped.closedWithoutAnswer()
	undisturbed(t)
}

func TestOversizedFrameGetsCloseFrameTooLarge(t *testing.T) {
	if os.Getenv("LEPUS_BIN") == "" {
		t.Skip("Lepus only: RabbitMQ 3.10.8 does not bound frames (it waits for the whole frame); later versions answer FRAME_TOO_LARGE as Lepus does")
	}
	c := dialRaw(t)
	c.open()
	// Announce a frame of 2 MiB over the 1 MiB frame_max: refused on its size alone.
	c.send(u32(2 * 1024 * 1024))
	c.send(make([]byte, 64))
	c.expect(0x0016, 14)
	undisturbed(t)
}

func TestCreditDrivesDeliveries(t *testing.T) {
	env := environment(t, streamURL())
	name := declared(t, env)
	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	confirms := producer.NotifyPublishConfirmation()
	publishConfirmed(t, producer, confirms, "a", "b")
	_ = producer.Close()

	c := dialRaw(t)
	c.open()
	// A subscription without credit gets nothing until it grants some, one chunk per credit.
	c.request(0x0007, u8(1), text(name), u16(1), u16(0))
	c.expect(0x8007, 1)
	_ = c.conn.SetReadDeadline(time.Now().Add(quietPeriod))
	if got, _ := c.conn.Read(make([]byte, 16)); got != 0 {
		t.Fatalf("a subscription without credit received %d bytes", got)
	}
	c.send(frame(0x0009, u8(1), u16(1)))
	key, deliver := c.receive()
	if key != 0x0008 || deliver[0] != 1 || binary.BigEndian.Uint64(deliver[1+24:]) != 0 {
		t.Fatalf("expected the chunk of offset 0 for subscription 1, got key %#04x %x", key, deliver[:min(len(deliver), 40)])
	}
	// Credit for a subscription that does not exist: the one answer a credit gets.
	c.send(frame(0x0009, u8(9), u16(1)))
	rest := c.expect(0x8009, 4)
	if rest[2] != 9 {
		t.Fatalf("credit answer names subscription %d, want 9", rest[2])
	}
	c.send(frame(0x0009, u8(1), u16(1)))
	key, deliver = c.receive()
	if key != 0x0008 || binary.BigEndian.Uint64(deliver[1+24:]) != 1 {
		t.Fatalf("expected the chunk of offset 1, got key %#04x", key)
	}
	c.request(0x000C, u8(1))
	c.expect(0x800C, 1)
	c.request(0x000C, u8(1))
	c.expect(0x800C, 4)
}
