from whetstone.runtime.service import service_main

from .bootstrap import build_service


def main() -> None:
    service_main(build_service)


if __name__ == "__main__":
    main()
