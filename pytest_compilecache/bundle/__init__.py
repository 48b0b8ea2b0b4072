"""The bundle file: its format, the C++ binaries it carries, the key index, and signatures."""
