"""``python -m fedrecgel.native``: build the native kernels ahead of time."""

from fedrecgel.native.ops import main

if __name__ == "__main__":
    main()
