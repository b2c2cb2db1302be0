#!/usr/bin/env python3
"""commit-msg hook (.pre-commit-config.yaml): the subject line fits one line, <= 80 characters."""
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    subject = f.readline().rstrip("\n")
if len(subject) > 80:
    print(f"commit subject is {len(subject)} characters (at most 80): {subject[:80]}...")
    sys.exit(1)
