from slipstream.controller.runtime.main import main

main()
