/**
 * A Python one-shot HTTP server on a Unix socket for the runner's egress relay tests: it binds
 * argv[1], prints `ready`, and answers one request with its request line (`via uds: GET … HTTP/1.1`).
 */
export const UDS_ECHO = `
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(1)
print('ready', flush=True)
c, _ = s.accept()
head = b''
while b'\\r\\n\\r\\n' not in head:
    head += c.recv(4096)
body = b'via uds: ' + head.split(b'\\r\\n')[0]
c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n' % len(body) + body)
c.close()
`;
