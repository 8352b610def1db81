#!/usr/bin/env python3
"""Distinct RSA-3072 agent keys for the simulated fleet of `dredge-bench server`, fast.

Generating 20,000 RSA-3072 keys one by one takes hours. A fleet for a benchmark does not need
independent keys, only distinct ones: this makes K ordinary keys, keeps their 2K primes and
pairs them up (p_i * p_j), which gives K(2K-1) distinct 3072-bit keys. Never use these keys
for anything but the benchmark: they share primes, so anyone holding two can factor both.

usage: bench-fleet-keys.py COUNT OUT   (OUT: u32 big-endian length + PKCS#8 DER, repeated)
"""
import math
import struct
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def main():
    count, out = int(sys.argv[1]), sys.argv[2]
    primes_needed = math.ceil((1 + math.sqrt(1 + 8 * count)) / 2)
    primes = []
    while len(primes) < primes_needed:
        numbers = rsa.generate_private_key(public_exponent=65537, key_size=3072).private_numbers()
        primes += [numbers.p, numbers.q]
    e = 65537
    written = 0
    with open(out + ".tmp", "wb") as f:
        for i in range(len(primes)):
            for j in range(i + 1, len(primes)):
                if written == count:
                    break
                p, q = primes[i], primes[j]
                if (p * q).bit_length() != 3072:
                    continue
                phi = (p - 1) * (q - 1)
                d = pow(e, -1, phi // math.gcd(p - 1, q - 1))
                private = rsa.RSAPrivateNumbers(
                    p=p, q=q, d=d, dmp1=d % (p - 1), dmq1=d % (q - 1), iqmp=pow(q, -1, p),
                    public_numbers=rsa.RSAPublicNumbers(e, p * q),
                ).private_key(unsafe_skip_rsa_key_validation=True)
                der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
                f.write(struct.pack(">I", len(der)) + der)
                written += 1
    if written < count:
        sys.exit(f"only {written} keys from {len(primes)} primes")
    import os
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
