"""The compiled extension is built by the package's own build and importable."""

from tsfront import _native


def test_native_extension_is_compiled_and_importable():
    assert _native.__file__.endswith(".so")
    assert _native.abi_version() >= 1
