# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the hottest pieces of the codec: the frame reader
(frames.FrameReader, with taking a whole basic.publish out of the receive buffer,
frames.scan_publish) and building a delivery's frames (hotpath.deliver_frames).
Profiles of the gateway under a flood put the publish scan and the delivery at
about a quarter of its time in pure Python, and at a steady rate the reader's
calls were five Python functions a read; here each is a few bounds checks and
one copy per piece. The pure twins are the reference: the tests run both on the
same inputs, and the pure ones serve when this module is not built (see
compiled.py).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING
from libc.string cimport memcpy, memmove

from .frames import READ_SIZE, SHRINK_ABOVE  # frames binds this module last: all defined
from .spec import CLASS_IDS, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD, method_id

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL

cdef unsigned char _METHOD = FRAME_METHOD
cdef unsigned char _HEADER = FRAME_HEADER
cdef unsigned char _BODY = FRAME_BODY
cdef unsigned char _END = FRAME_END
cdef unsigned int _BASIC = CLASS_IDS["basic"]
cdef unsigned int _PUBLISH_CLASS, _PUBLISH_METHOD, _DELIVER_CLASS, _DELIVER_METHOD
_PUBLISH_CLASS, _PUBLISH_METHOD = method_id("basic.publish")
_DELIVER_CLASS, _DELIVER_METHOD = method_id("basic.deliver")


cdef inline unsigned int _get16(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 8) | p[1]


cdef inline unsigned long long _get32(const unsigned char* p) noexcept:
    return ((<unsigned long long>p[0] << 24) | (<unsigned long long>p[1] << 16)
            | (<unsigned long long>p[2] << 8) | p[3])


cdef inline unsigned long long _get64(const unsigned char* p) noexcept:
    return (_get32(p) << 32) | _get32(p + 4)


cdef inline unsigned char* _put16(unsigned char* p, unsigned int v) noexcept:
    p[0] = (v >> 8) & 0xFF
    p[1] = v & 0xFF
    return p + 2


cdef inline unsigned char* _put32(unsigned char* p, unsigned long long v) noexcept:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF
    return p + 4


cdef inline unsigned char* _put64(unsigned char* p, unsigned long long v) noexcept:
    return _put32(_put32(p, v >> 32), v & 0xFFFFFFFF)


cdef inline unsigned char* _frame_prefix(unsigned char* p, unsigned char kind,
                                         unsigned int channel, unsigned long long size) noexcept:
    p[0] = kind
    return _put32(_put16(p + 1, channel), size)


cdef inline unsigned char* _copy(unsigned char* p, const char* data, Py_ssize_t size) noexcept:
    memcpy(p, data, size)
    return p + size


cdef object _scan(bytearray buf, Py_ssize_t offset, Py_ssize_t limit, Py_ssize_t frame_max):
    """frames.scan_publish: (channel, method payload, raw properties, body, end) or None."""
    cdef const unsigned char* base = <const unsigned char*>PyByteArray_AS_STRING(buf)
    cdef const unsigned char* p = base + offset
    cdef Py_ssize_t size, header, body, end, header_size
    cdef unsigned long long body_size
    cdef unsigned int channel
    if limit - offset < 11 or p[0] != _METHOD or _get16(p + 7) != _PUBLISH_CLASS \
            or _get16(p + 9) != _PUBLISH_METHOD:
        return None
    channel = _get16(p + 1)
    size = <Py_ssize_t>_get32(p + 3)
    header = offset + 8 + size
    if limit < header + 22 or size > frame_max or base[header - 1] != _END:
        return None
    p = base + header
    header_size = <Py_ssize_t>_get32(p + 3)
    body_size = _get64(p + 11)
    body = header + 8 + header_size
    if (p[0] != _HEADER or _get16(p + 1) != channel or _get16(p + 7) != _BASIC
            or _get16(p + 9) != 0 or header_size < 14 or header_size > frame_max
            or limit < body or base[body - 1] != _END):
        return None
    if body_size:
        if body_size > <unsigned long long>frame_max:
            return None
        end = body + 8 + <Py_ssize_t>body_size
        p = base + body
        if limit < end or base[end - 1] != _END or p[0] != _BODY or _get16(p + 1) != channel \
                or _get32(p + 3) != body_size:
            return None
        content = PyBytes_FromStringAndSize(<const char*>p + 7, <Py_ssize_t>body_size)
    else:
        end = body
        content = b""
    return (channel, PyBytes_FromStringAndSize(<const char*>base + offset + 7, size),
            PyBytes_FromStringAndSize(<const char*>base + header + 19, header_size - 12),
            content, end)


def scan_publish(bytearray buf, Py_ssize_t offset, Py_ssize_t limit, Py_ssize_t frame_max):
    """frames.scan_publish: (channel, method payload, raw properties, body, end) or None."""
    return _scan(buf, offset, limit, frame_max)


cdef class FrameReader:
    """frames.FrameReader, compiled: a connection's every read and frame passes here.
    The same buffer discipline (room exported to the transport, resized only in
    get_buffer and receive_data); a framing error is left to the pure reader, which
    raises it with RabbitMQ's text."""

    cdef public Py_ssize_t frame_max
    cdef readonly bytearray _buffer
    cdef readonly Py_ssize_t _offset, _end

    def __init__(self, Py_ssize_t frame_max):
        self.frame_max = frame_max
        self._buffer = bytearray()
        self._offset = self._end = 0

    @property
    def buffered(self):
        return self._end - self._offset

    def get_buffer(self, Py_ssize_t size_hint=-1):
        self._reserve(size_hint if size_hint > READ_SIZE else READ_SIZE)
        return memoryview(self._buffer)[self._end:]

    def buffer_updated(self, Py_ssize_t nbytes):
        self._end += nbytes

    def receive_data(self, data):
        cdef Py_ssize_t size = len(data)
        self._reserve(size)
        self._buffer[self._end:self._end + size] = data  # same length: no resize
        self._end += size

    def release(self):
        if self._offset == self._end:
            self._buffer = bytearray()
            self._offset = self._end = 0

    cdef int _reserve(self, Py_ssize_t room) except -1:
        cdef Py_ssize_t offset = self._offset, end = self._end, missing
        cdef char* base
        if offset == end:
            self._offset = self._end = end = 0
            if len(self._buffer) > SHRINK_ABOVE:  # done with a large frame
                self._buffer = bytearray()
        elif len(self._buffer) - end < room and offset:
            end -= offset
            base = PyByteArray_AS_STRING(self._buffer)
            memmove(base, base + offset, end)
            self._offset, self._end = 0, end
        missing = end + room - len(self._buffer)
        if missing > 0:  # grown by at least the data held (raises BufferError while exported)
            self._buffer += bytes(missing if missing > end else end)
        return 0

    def read_protocol_header(self):
        cdef Py_ssize_t start = self._offset
        if self._end - start < 8:
            return None
        self._offset += 8
        return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self._buffer) + start, 8)

    def next_publish(self):
        found = _scan(self._buffer, self._offset, self._end, self.frame_max)
        if found is None:
            return None
        self._offset = (<tuple>found)[4]
        return (<tuple>found)[:4]

    def next_frame(self):
        cdef const unsigned char* base = <const unsigned char*>PyByteArray_AS_STRING(self._buffer)
        cdef const unsigned char* p = base + self._offset
        cdef Py_ssize_t size, end
        if self._end - self._offset < 7:
            return None
        size = <Py_ssize_t>_get32(p + 3)
        if size > self.frame_max:
            return _pure_next_frame(self)  # raises FrameError
        end = self._offset + 7 + size
        if self._end <= end:
            return None
        if base[end] != _END or (p[0] == _METHOD and size < 4):
            return _pure_next_frame(self)  # raises FrameError
        frame = (p[0], _get16(p + 1), PyBytes_FromStringAndSize(<const char*>p + 7, size))
        self._offset = end + 1
        return frame


cdef object _pure_next_frame(FrameReader reader):
    from .frames import PureFrameReader
    return PureFrameReader.next_frame(reader)


def deliver_frames(unsigned int channel, bytes consumer_tag, unsigned long long delivery_tag,
                   bint redelivered, str exchange, str routing_key, bytes properties,
                   bytes body, Py_ssize_t frame_max):
    """hotpath.deliver_frames: basic.deliver, its content header and its body frames
    (split to fit frame_max), in one bytes."""
    cdef Py_ssize_t exchange_size, key_size, method_size, body_size, chunk, frames, piece
    cdef Py_ssize_t tag_size = PyBytes_GET_SIZE(consumer_tag)
    cdef Py_ssize_t properties_size = PyBytes_GET_SIZE(properties)
    cdef const char* exchange_utf8 = PyUnicode_AsUTF8AndSize(exchange, &exchange_size)
    cdef const char* key_utf8 = PyUnicode_AsUTF8AndSize(routing_key, &key_size)
    cdef const char* body_data = PyBytes_AS_STRING(body)
    cdef unsigned char* p
    if exchange_size > 255 or key_size > 255:
        raise ValueError("a shortstr is at most 255 bytes")
    body_size = PyBytes_GET_SIZE(body)
    chunk = frame_max - 8
    if chunk <= 0:
        raise ValueError("frame_max leaves no room for a body")
    frames = (body_size + chunk - 1) // chunk
    method_size = 4 + tag_size + 9 + 1 + exchange_size + 1 + key_size
    data = PyBytes_FromStringAndSize(NULL, (8 + method_size) + (8 + 12 + properties_size)
                                     + 8 * frames + body_size)
    p = <unsigned char*>PyBytes_AS_STRING(data)
    p = _frame_prefix(p, _METHOD, channel, method_size)
    p = _put16(_put16(p, _DELIVER_CLASS), _DELIVER_METHOD)
    p = _copy(p, PyBytes_AS_STRING(consumer_tag), tag_size)
    p = _put64(p, delivery_tag)
    p[0] = 1 if redelivered else 0
    p[1] = <unsigned char>exchange_size
    p = _copy(p + 2, exchange_utf8, exchange_size)
    p[0] = <unsigned char>key_size
    p = _copy(p + 1, key_utf8, key_size)
    p[0] = _END
    p = _frame_prefix(p + 1, _HEADER, channel, 12 + properties_size)
    p = _put64(_put16(_put16(p, _BASIC), 0), body_size)
    p = _copy(p, PyBytes_AS_STRING(properties), properties_size)
    p[0] = _END
    p += 1
    while body_size > 0:
        piece = chunk if body_size > chunk else body_size
        p = _frame_prefix(p, _BODY, channel, piece)
        p = _copy(p, body_data, piece)
        p[0] = _END
        p += 1
        body_data += piece
        body_size -= piece
    return data
