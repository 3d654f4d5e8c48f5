#!/usr/bin/env python3
"""Per-kernel digest of the device code in a cubin, to show that an edit left the machine code alone.

    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --default-stream per-thread -cubin -o a.cubin train_fox.cu
    python3 dev/cubin_digest.py a.cubin > before.txt     # edit, build again, then
    python3 dev/cubin_digest.py a.cubin | diff before.txt -
    python3 dev/cubin_digest.py --text a.cubin    # the SASS bytes alone (see below)

One line per kernel: a hash of its SASS bytes (.text.<kernel>), its attributes (.nv.info.<kernel>:
registers, parameters, barriers), its static shared memory and constant bank, and its relocations
with the symbols resolved to names (so moving functions around the file does not change it), then
the mangled name. Reads the ELF directly: no cuobjdump needed, so it runs on a build machine without
a GPU. `cuobjdump -sass` of two builds with equal digests prints the same instructions.

--text: one line per kernel, a hash of its .text section alone, then the mangled name. A kernel that gained a
template flag or a trailing parameter (its name and parameter records change) keeps the hash of its instructions:
`comm -23` of the sorted hashes of two builds lists the old machine code that no kernel of the new build has."""
import hashlib
import struct
import sys

PARTS = ('.text.', '.nv.info.', '.nv.shared.', '.nv.constant0.', '.rel.text.', '.rela.text.')
SHT_NOBITS = 8


def read_sections(data):
    if data[:4] != b'\x7fELF' or data[4] != 2:
        sys.exit("error: not a 64-bit ELF file\nHINT: pass a .cubin built with nvcc -cubin")
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, _, _, off, size, link, _, _, _ = struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize)
        secs.append({'name': name, 'type': typ, 'off': off, 'size': size, 'link': link})
    names = secs[shstrndx]['off']
    for s in secs:
        s['name'] = data[names + s['name']:data.index(b'\0', names + s['name'])].decode()
    return secs


def info_attributes(b, symbol):
    """The attribute list of .nv.info.<kernel>, with EIATTR_PARAM_CBANK's symbol index named."""
    out, i = [], 0
    while i + 2 <= len(b):
        fmt, attr = b[i], b[i + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then the payload
            size, = struct.unpack_from('<H', b, i + 2)
            payload = b[i + 4:i + 4 + size]
            if attr == 0x0A and size >= 4:  # EIATTR_PARAM_CBANK: symbol index, offset, size
                payload = symbol(struct.unpack_from('<I', payload)[0]).encode() + payload[4:]
            out.append(b'%d %d ' % (fmt, attr) + payload)
            i += 4 + size
        else:  # EIFMT_NVAL, _BVAL, _HVAL: a 4-byte record (the value, if any, in its last two bytes)
            out.append(b[i:i + 4])
            i += 4
    if i != len(b):
        sys.exit("error: could not parse an .nv.info section (a record runs past its end)\n"
                 "HINT: a new cubin attribute format; compare the .text sections by hand")
    return b'\n'.join(out)


def main(path, text_only=False):
    try:
        data = open(path, 'rb').read()
    except OSError as e:
        sys.exit(f"error: {e}\nHINT: build one with nvcc ... --default-stream per-thread -cubin -o {path} train_fox.cu")
    secs = read_sections(data)
    symtab = next(s for s in secs if s['name'] == '.symtab')
    strs = secs[symtab['link']]['off']

    def symbol(i):
        o, = struct.unpack_from('<I', data, symtab['off'] + i * 24)
        return data[strs + o:data.index(b'\0', strs + o)].decode()

    kernels = {}
    for s in secs:
        part = next((p for p in PARTS if s['name'].startswith(p)), None)
        if part is None:
            continue
        body = data[s['off']:s['off'] + s['size']] if s['type'] != SHT_NOBITS else b'nobits %d' % s['size']
        if text_only and part != '.text.':
            continue
        if part == '.nv.info.':
            body = info_attributes(body, symbol)
        elif part.startswith('.rel'):
            entry = 16 if part == '.rel.text.' else 24
            rows = []
            for j in range(s['size'] // entry):
                off, info = struct.unpack_from('<QQ', data, s['off'] + j * entry)
                rows.append('%x %s %d' % (off, symbol(info >> 32), info & 0xffffffff))
            body = '\n'.join(rows).encode()
        kernels.setdefault(s['name'][len(part):], []).append((part, hashlib.sha256(body).hexdigest()))
    for name in sorted(kernels):
        print(hashlib.sha256(repr(sorted(kernels[name])).encode()).hexdigest()[:16], name)


if __name__ == '__main__':
    args = sys.argv[1:]
    text = args[:1] == ['--text']
    if len(args) != 1 + text:
        sys.exit("usage: dev/cubin_digest.py [--text] file.cubin")
    main(args[-1], text)
